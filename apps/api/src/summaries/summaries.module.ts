import { Module } from '@nestjs/common';
import { JobsModule } from '@app/jobs';
import { SummariesController } from './summaries.controller';
import { SummaryStatusService } from './summary-status.service';

@Module({
  imports: [JobsModule],
  controllers: [SummariesController],
  providers: [SummaryStatusService],
})
export class SummariesModule {}
