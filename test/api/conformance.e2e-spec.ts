import { describeIdempotentRoute } from '@app/idempotency/testing/idempotent-route.conformance';
import { JOBS_STREAM } from '@app/summary-queue';
import type { AddressInfo } from 'node:net';
import { bearer, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { FakePaymentsServer } from '../support/fake-payments-server';
import { freshRedis } from '../support/infra';
import { NextRunGate } from '../support/next-run-gate';
import { gatedWorkflowClient } from '../support/workflow-client';

describeIdempotentRoute('POST /v1/summaries', async () => {
  const redis = await freshRedis();
  const gate = new NextRunGate();
  // The real start, with the gate before it: the handler has claimed its key and waits, as on a slow Redis.
  const api = await startApi({ override: gatedWorkflowClient(gate) });
  return {
    server: api.server,
    method: 'POST',
    path: '/v1/summaries',
    headers: { authorization: bearer(TENANT_A) },
    body: { text: 'The quick brown fox jumps over the lazy dog.', notify: 'ops@example.com' },
    otherBody: { text: 'Something else entirely.', notify: 'ops@example.com' },
    invalidBody: { text: 'The quick brown fox.', notify: 'not-an-email' },
    successStatus: 202,
    hold: () => gate.hold(),
    effects: () => redis.xlen(JOBS_STREAM),
    errors: 'problem',
    teardown: async () => {
      await api.close();
      redis.disconnect();
    },
  };
});

describeIdempotentRoute(
  'POST /v1/chat/completions (the gateway)',
  async () => {
    await (await freshRedis()).quit();
    const gate = new NextRunGate();
    const provider = await new FakeOpenAiServer(async (_n, text) => {
      await gate.pass();
      return { kind: 'complete', content: `Echo: ${text}` };
    }).start();
    const api = await startApi({
      env: { LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'sk', OPENAI_BASE_URL: provider.baseUrl },
    });
    await api.app.listen(0, '127.0.0.1');
    const body = { model: 'gpt-test', messages: [{ role: 'user', content: 'conformance' }], temperature: 0.2 };
    return {
      server: `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`,
      method: 'POST',
      path: '/v1/chat/completions',
      headers: { authorization: bearer(TENANT_A) },
      body,
      otherBody: { ...body, temperature: 0.9 },
      invalidBody: { model: 'm' },
      successStatus: 200,
      hold: () => gate.hold(),
      effects: async () => provider.calls,
      errors: 'openai',
      teardown: async () => {
        await provider.stop();
        await api.close();
      },
    };
  },
  { whileRunning: 'attached', keyRequired: false },
);

describeIdempotentRoute('POST /v1/refunds (PostgreSQL records, committed with the refund)', async () => {
  const provider = await new FakePaymentsServer().start();
  const api = await startApi({ env: { PAYMENTS_URL: provider.url(), PAYMENTS_TIMEOUT_S: '10' } });
  const body = { ticket_id: 'T-conformance', order_id: 'ord-conformance', amount: 1250, currency: 'EUR' };
  return {
    server: api.server,
    method: 'POST',
    path: '/v1/refunds',
    headers: { authorization: bearer(TENANT_A) },
    body,
    otherBody: { ...body, amount: 990 },
    invalidBody: { ...body, amount: '1250' },
    successStatus: 201,
    // The provider holds the next payout: the request has claimed its key and waits on the payment.
    hold: () => {
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const arrived = provider.payoutRequests().length + 1;
      provider.nextPayouts({ kind: 'gate', gate });
      return { reached: provider.arrivals(arrived), release };
    },
    effects: async () => provider.payouts.length,
    errors: 'problem',
    teardown: async () => {
      await api.close();
      await provider.stop();
    },
  };
});
