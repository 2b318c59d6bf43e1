import { Module } from '@nestjs/common';
import { DeadLetterQueue } from './dead-letters';
import { SummaryJobQueue } from './summary-job.queue';

/** The summary job stream, its dead letters and the job records. Needs the global RedisModule. */
@Module({
  providers: [SummaryJobQueue, DeadLetterQueue],
  exports: [SummaryJobQueue, DeadLetterQueue],
})
export class SummaryQueueModule {}
