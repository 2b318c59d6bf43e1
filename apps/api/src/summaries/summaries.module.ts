import { Module } from '@nestjs/common';
import { SummaryQueueModule } from '@app/summary-queue';
import { SummariesController } from './summaries.controller';
import { SummaryStatusService } from './summary-status.service';

@Module({
  imports: [SummaryQueueModule],
  controllers: [SummariesController],
  providers: [SummaryStatusService],
})
export class SummariesModule {}
