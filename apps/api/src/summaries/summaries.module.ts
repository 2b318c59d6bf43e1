import { Module } from '@nestjs/common';
import { SummariesController } from './summaries.controller';
import { SummaryStatusService } from './summary-status.service';

/** Needs the global SummaryQueueModule (ApiModule's, with JOB_STREAM_PARTITIONS). */
@Module({
  controllers: [SummariesController],
  providers: [SummaryStatusService],
})
export class SummariesModule {}
