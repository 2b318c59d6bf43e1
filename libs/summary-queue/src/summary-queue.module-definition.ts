import { ConfigurableModuleBuilder } from '@nestjs/common';

export interface SummaryQueueModuleOptions {
  /** JOB_STREAM_PARTITIONS: every app of one system must give the same count. */
  readonly partitions: number;
}

export const { ConfigurableModuleClass, MODULE_OPTIONS_TOKEN: SUMMARY_QUEUE_OPTIONS } =
  new ConfigurableModuleBuilder<SummaryQueueModuleOptions>({ moduleName: 'SummaryQueue' })
    .setClassMethodName('forRoot')
    .setExtras({ isGlobal: false }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
    .build();
