import { Inject } from '@nestjs/common';
import type { StartedRun, StartOptions, WorkflowClient } from './workflow.client';

/** The injection token of one registered workflow's handle (WorkflowClientModule.forClient provides one per name). */
export const workflowToken = (name: string): string => `workflows:handle:${name}`;

/**
 * Injects the handle of workflow `name`, as @InjectQueue('name') does with
 * @nestjs/bullmq: an app that did not register `name` with
 * WorkflowClientModule.forClient stops at boot (Nest cannot resolve the
 * token), not at the first request.
 */
export const InjectWorkflow = (name: string): ParameterDecorator & PropertyDecorator => Inject(workflowToken(name));

/** One registered workflow, for the route that starts it. */
export class WorkflowHandle<I = unknown> {
  constructor(
    readonly name: string,
    private readonly client: WorkflowClient,
  ) {}

  /** WorkflowClient.start of this workflow: the same errors, the same run for the same request. */
  start(input: I, options: StartOptions): Promise<StartedRun> {
    return this.client.start(this.name, input, options);
  }
}
