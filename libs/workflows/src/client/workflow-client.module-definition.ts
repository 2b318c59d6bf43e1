import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { WorkflowRegistration } from './client-queues';

export interface WorkflowClientModuleOptions {
  /**
   * The workflows this app starts or reads: a name alone is on the shared
   * queue `workflows`; `{ name, queue }` has a queue of its own (summaries:
   * `{ name: 'summaries', queue: 'summaries' }`). The same names and queues as
   * the worker's @Workflow() classes.
   */
  readonly workflows: readonly WorkflowRegistration[];
  /** JOB_STREAM_PARTITIONS: the same count as the worker's and SummaryQueueModule's. Default 1. */
  readonly partitions?: number;
}

export const { ConfigurableModuleClass, MODULE_OPTIONS_TOKEN: WORKFLOW_CLIENT_OPTIONS } =
  new ConfigurableModuleBuilder<WorkflowClientModuleOptions>({ moduleName: 'WorkflowClient' })
    .setClassMethodName('forClient')
    .setExtras({ isGlobal: false }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
    .build();
