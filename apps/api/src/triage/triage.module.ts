import { Module } from '@nestjs/common';
import { TriageController } from './triage.controller';

/** Needs the global WorkflowClientModule (ApiModule's), with `triage` registered. */
@Module({ controllers: [TriageController] })
export class TriageModule {}
