import type { Type } from '@nestjs/common';
import type { QueueLayout } from './queue-layout';

/** One step of a workflow, as the explorer found it. */
export interface StepDefinition {
  readonly name: string;
  /** The method's name on the workflow's class. */
  readonly method: string;
  readonly timeoutMs?: number;
}

/** One workflow, as the explorer found it: its options and its steps in declaration order. */
export interface WorkflowDefinition {
  readonly name: string;
  readonly queue: string;
  readonly group: string;
  readonly input?: Type<object>;
  /** Its input parser (`@Workflow({ parse })`): a refusal is `malformed`, before anything else. */
  readonly parse?: (payload: unknown) => unknown;
  readonly deadlineMs?: number;
  readonly steps: readonly StepDefinition[];
  /** The provider's class. */
  readonly type: Type<object>;
  /** The provider's instance (resolved when the first step runs: Nest creates it after the explorer ran). */
  instance(): object;
}

/** A queue the worker consumes, and the workflows whose runs go to it. */
export interface WorkflowQueue {
  readonly name: string;
  readonly group: string;
  readonly layout: QueueLayout;
  /** Several workflows on a queue: its entries name theirs (`workflow`). */
  readonly shared: boolean;
  readonly workflows: ReadonlyMap<string, WorkflowDefinition>;
}

/** Every workflow this process runs, by name and by queue; built once at start (WorkflowsExplorer). */
export class WorkflowRegistry {
  private readonly byName: ReadonlyMap<string, WorkflowDefinition>;

  constructor(readonly queues: readonly WorkflowQueue[]) {
    this.byName = new Map(queues.flatMap((q) => [...q.workflows.values()].map((w) => [w.name, w] as const)));
  }

  workflow(name: string): WorkflowDefinition | undefined {
    return this.byName.get(name);
  }

  queue(name: string): WorkflowQueue | undefined {
    return this.queues.find((q) => q.name === name);
  }

  get workflows(): readonly WorkflowDefinition[] {
    return [...this.byName.values()];
  }
}
