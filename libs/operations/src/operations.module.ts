import { Module } from '@nestjs/common';
import { JobsModule } from '@app/jobs';
import { AdminActionCounts } from './admin-action-counts';
import { OperationsService } from './operations.service';

/** Needs the global RedisModule and PersistenceModule. */
@Module({
  imports: [JobsModule],
  providers: [OperationsService, AdminActionCounts],
  exports: [OperationsService],
})
export class OperationsModule {}
