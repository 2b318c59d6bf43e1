import { type DynamicModule, Module, type Provider } from '@nestjs/common';
import { ClientQueues, type WorkflowRegistration } from './client-queues';
import {
  ConfigurableModuleClass,
  WORKFLOW_CLIENT_OPTIONS,
  type WorkflowClientModuleOptions,
} from './workflow-client.module-definition';
import { WorkflowRunsReader } from './workflow-runs.reader';
import { WorkflowClient } from './workflow.client';
import { WorkflowHandle, workflowToken } from './workflow.handle';

/**
 * The api's side of the workflows: `WorkflowClientModule.forClient({
 * workflows: ['triage', { name: 'summaries', queue: 'summaries' }],
 * partitions })` provides WorkflowClient and, for each workflow named, its
 * WorkflowHandle (`@InjectWorkflow('triage')`). Needs the global RedisModule
 * and a TypeORM DataSource (PersistenceModule). A name registered twice, or
 * two workflows on one queue of their own, stop the start.
 */
@Module({
  providers: [
    {
      provide: ClientQueues,
      inject: [WORKFLOW_CLIENT_OPTIONS],
      useFactory: (options: WorkflowClientModuleOptions) =>
        new ClientQueues(options.workflows, options.partitions ?? 1),
    },
    WorkflowRunsReader,
    WorkflowClient,
  ],
  exports: [WorkflowClient],
})
export class WorkflowClientModule extends ConfigurableModuleClass {
  /**
   * The handles' tokens must be known when the module is built, so they come
   * from the options given here (forClientAsync provides the client alone).
   */
  static forClient(options: Parameters<typeof ConfigurableModuleClass.forClient>[0]): DynamicModule {
    const base = super.forClient(options);
    const handles = options.workflows.map(nameOf).map((name): Provider => ({
      provide: workflowToken(name),
      inject: [WorkflowClient],
      useFactory: (client: WorkflowClient) => new WorkflowHandle(name, client),
    }));
    return {
      ...base,
      providers: [...(base.providers ?? []), ...handles],
      exports: [...(base.exports ?? []), ...handles.map((h) => (h as { provide: string }).provide)],
    };
  }
}

function nameOf(registration: WorkflowRegistration): string {
  return typeof registration === 'string' ? registration : registration.name;
}
