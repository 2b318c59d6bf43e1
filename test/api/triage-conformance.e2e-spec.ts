import { describeIdempotentRoute, type RouteHold } from '@app/idempotency/testing/idempotent-route.conformance';
import { REDIS_CLIENT, type RedisClient } from '@app/redis';
import { ClientQueues, type StartedRun, type StartOptions, WorkflowClient } from '@app/workflows';
import { DataSource } from 'typeorm';
import { bearer, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis } from '../support/infra';

/** The real client, with a gate before the next start: the handler has claimed its key and waits, then starts. */
class GatedWorkflowClient extends WorkflowClient {
  private held: { arrived: () => void; released: Promise<void> } | undefined;

  hold(): RouteHold {
    let arrived!: () => void;
    let release!: () => void;
    const reached = new Promise<void>((r) => (arrived = r));
    const released = new Promise<void>((r) => (release = r));
    this.held = { arrived, released };
    return { reached, release };
  }

  override async start(name: string, input: unknown, options: StartOptions): Promise<StartedRun> {
    const held = this.held;
    this.held = undefined;
    if (held) {
      held.arrived();
      await held.released;
    }
    return super.start(name, input, options);
  }
}

describeIdempotentRoute('POST /v1/triage', async () => {
  const redis = await freshRedis();
  let client!: GatedWorkflowClient;
  const api = await startApi({
    override: (b) =>
      b.overrideProvider(WorkflowClient).useFactory({
        factory: (queues: ClientQueues, r: RedisClient, ds: DataSource) =>
          (client = new GatedWorkflowClient(queues, r, ds)),
        inject: [ClientQueues, REDIS_CLIENT, DataSource],
      }),
  });
  const body = { ticket_id: 'T-1', text: 'The parcel never came.', notify: 'ops@example.com' };
  return {
    server: api.server,
    method: 'POST',
    path: '/v1/triage',
    headers: { authorization: bearer(TENANT_A) },
    body,
    otherBody: { ...body, ticket_id: 'T-2' },
    invalidBody: { ...body, notify: 'not-an-email' },
    successStatus: 202,
    hold: () => client.hold(),
    // Each start is one step entry on the shared queue.
    effects: () => redis.xlen('{workflows}:jobs'),
    errors: 'problem',
    teardown: async () => {
      await api.close();
      redis.disconnect();
    },
  };
});
