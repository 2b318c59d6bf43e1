import { Module } from '@nestjs/common';
import { SummaryJobQueue } from './summary-job.queue';

/** The summary job stream and job records. Needs the global RedisModule. */
@Module({
  providers: [SummaryJobQueue],
  exports: [SummaryJobQueue],
})
export class JobsModule {}
