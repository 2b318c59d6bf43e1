import { describeIdempotentRoute } from '@app/idempotency/testing/idempotent-route.conformance';
import { bearer, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis } from '../support/infra';
import { NextRunGate } from '../support/next-run-gate';
import { gatedWorkflowClient } from '../support/workflow-client';

describeIdempotentRoute('POST /v1/triage', async () => {
  const redis = await freshRedis();
  const gate = new NextRunGate();
  // The real client, with the gate before the next start: the handler has claimed its key and waits, then starts.
  const api = await startApi({ override: gatedWorkflowClient(gate) });
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
    hold: () => gate.hold(),
    // Each start is one step entry on the shared queue.
    effects: () => redis.xlen('{workflows}:jobs'),
    errors: 'problem',
    teardown: async () => {
      await api.close();
      redis.disconnect();
    },
  };
});
