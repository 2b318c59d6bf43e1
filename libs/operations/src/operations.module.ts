import { Module } from '@nestjs/common';
import { AdminActionCounts } from './admin-action-counts';
import { OperationsService } from './operations.service';

/**
 * Needs the global RedisModule, PersistenceModule and SummaryQueueModule
 * (`forRoot({ partitions, isGlobal: true })`): the app's one layout of the job stream.
 */
@Module({
  providers: [OperationsService, AdminActionCounts],
  exports: [OperationsService],
})
export class OperationsModule {}
