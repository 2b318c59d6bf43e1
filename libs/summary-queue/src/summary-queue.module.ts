import { Module } from '@nestjs/common';
import { DeadLetterQueue } from './dead-letters';
import { OperatedQueues } from '@app/workflows';
import { operatedQueues } from './operated-queues';
import { SummaryJobQueue } from './summary-job.queue';
import {
  ConfigurableModuleClass,
  SUMMARY_QUEUE_OPTIONS,
  type SummaryQueueModuleOptions,
} from './summary-queue.module-definition';
import { SummaryStreams } from './summary-streams';

/**
 * The summary job stream's partitions, their dead letters and the job
 * records, and the queues the admin tools look into (OperatedQueues: the
 * workflows queue too, with the same partition count). Needs the global RedisModule. An app imports it once, as
 * `forRoot({ partitions, isGlobal: true })`, so the api's routes, the admin
 * tools and the worker all see the one layout (SummaryStreams); imported
 * without options it is the single stream of old.
 */
@Module({
  providers: [
    {
      provide: SummaryStreams,
      inject: [{ token: SUMMARY_QUEUE_OPTIONS, optional: true }],
      useFactory: (options?: SummaryQueueModuleOptions) => new SummaryStreams(options?.partitions ?? 1),
    },
    {
      provide: OperatedQueues,
      inject: [SummaryStreams],
      useFactory: (streams: SummaryStreams) => operatedQueues(streams),
    },
    SummaryJobQueue,
    DeadLetterQueue,
  ],
  exports: [SummaryStreams, OperatedQueues, SummaryJobQueue, DeadLetterQueue],
})
export class SummaryQueueModule extends ConfigurableModuleClass {}
