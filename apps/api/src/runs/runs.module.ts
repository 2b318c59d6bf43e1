import { Module } from '@nestjs/common';
import { RunsController } from './runs.controller';

/** Needs the global WorkflowClientModule (ApiModule's, with JOB_STREAM_PARTITIONS). */
@Module({ controllers: [RunsController] })
export class RunsModule {}
