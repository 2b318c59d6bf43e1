import { Module } from '@nestjs/common';
import { ClientQueues } from './client-queues';
import {
  ConfigurableModuleClass,
  WORKFLOW_CLIENT_OPTIONS,
  type WorkflowClientModuleOptions,
} from './workflow-client.module-definition';
import { WorkflowClient } from './workflow.client';

/**
 * The api's side of the workflows: `WorkflowClientModule.forClient({
 * workflows: ['triage', { name: 'summaries', queue: 'summaries' }],
 * partitions })` provides WorkflowClient. Needs the global RedisModule and a
 * TypeORM DataSource (PersistenceModule). A name registered twice, or two
 * workflows on one queue of their own, stop the start.
 */
@Module({
  providers: [
    {
      provide: ClientQueues,
      inject: [WORKFLOW_CLIENT_OPTIONS],
      useFactory: (options: WorkflowClientModuleOptions) =>
        new ClientQueues(options.workflows, options.partitions ?? 1),
    },
    WorkflowClient,
  ],
  exports: [WorkflowClient],
})
export class WorkflowClientModule extends ConfigurableModuleClass {}
