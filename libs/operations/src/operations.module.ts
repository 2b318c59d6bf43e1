import { Module } from '@nestjs/common';
import { JobsModule } from '@app/jobs';
import { OperationsService } from './operations.service';

/** Needs the global RedisModule and PersistenceModule. */
@Module({
  imports: [JobsModule],
  providers: [OperationsService],
  exports: [OperationsService],
})
export class OperationsModule {}
