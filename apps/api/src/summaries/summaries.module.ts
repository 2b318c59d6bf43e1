import { Module } from '@nestjs/common';
import { SummariesController } from './summaries.controller';
import { SummaryStatusService } from './summary-status.service';

/**
 * Needs the global SummaryQueueModule (the job records GET reads) and the global WorkflowClientModule with
 * `summaries` registered on its own queue (the start), both ApiModule's, with JOB_STREAM_PARTITIONS.
 */
@Module({
  controllers: [SummariesController],
  providers: [SummaryStatusService],
})
export class SummariesModule {}
