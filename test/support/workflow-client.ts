import type { TestingModuleBuilder } from '@nestjs/testing';
import { type Durability, REDIS_CLIENT, type RedisClient } from '@app/redis';
import { ClientQueues, type StartedRun, type StartOptions, WorkflowClient, WorkflowRunsReader } from '@app/workflows';
import type { NextRunGate } from './next-run-gate';

/** What WorkflowClient is made of in the api, for a test that makes its own. */
export interface WorkflowClientParts {
  readonly queues: ClientQueues;
  readonly redis: RedisClient;
  readonly reader: WorkflowRunsReader;
}

/**
 * The api's WorkflowClient replaced by `make(parts)`: every route's start
 * (the handles of @InjectWorkflow are made from it) and GET /v1/runs use it.
 */
export const overrideWorkflowClient =
  (make: (parts: WorkflowClientParts) => WorkflowClient) =>
  (builder: TestingModuleBuilder): TestingModuleBuilder =>
    builder.overrideProvider(WorkflowClient).useFactory({
      factory: (queues: ClientQueues, redis: RedisClient, reader: WorkflowRunsReader) =>
        make({ queues, redis, reader }),
      inject: [ClientQueues, REDIS_CLIENT, WorkflowRunsReader],
    });

/** The real client, asking for `durability` on its starts only (the idempotency records are written as before). */
export const durableWorkflowClient = (durability: Durability) =>
  overrideWorkflowClient(({ queues, redis, reader }) => new WorkflowClient(queues, redis, reader, durability));

/** The real client, each start waiting at `gate` first: the handler has claimed its key and waits, then starts. */
export class GatedWorkflowClient extends WorkflowClient {
  constructor(
    { queues, redis, reader }: WorkflowClientParts,
    private readonly gate: NextRunGate,
  ) {
    super(queues, redis, reader);
  }

  override async start(name: string, input: unknown, options: StartOptions): Promise<StartedRun> {
    await this.gate.pass();
    return super.start(name, input, options);
  }
}

export const gatedWorkflowClient = (gate: NextRunGate) =>
  overrideWorkflowClient((parts) => new GatedWorkflowClient(parts, gate));
