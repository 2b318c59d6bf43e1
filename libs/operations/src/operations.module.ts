import { Module } from '@nestjs/common';
import { SummaryQueueModule } from '@app/summary-queue';
import { AdminActionCounts } from './admin-action-counts';
import { OperationsService } from './operations.service';

/** Needs the global RedisModule and PersistenceModule. */
@Module({
  imports: [SummaryQueueModule],
  providers: [OperationsService, AdminActionCounts],
  exports: [OperationsService],
})
export class OperationsModule {}
