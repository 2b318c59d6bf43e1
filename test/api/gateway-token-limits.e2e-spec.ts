import { randomUUID } from 'node:crypto';
import { worstCaseTokens, TenantTokenLimiter, tokensKey } from '@app/llm';
import { bearer, TENANT_A, TENANT_B } from '../support/api-harness';
import { completionEvents } from '../support/fake-openai-server';
import { type GatewayHarness, startGateway } from '../support/gateway-harness';
import { eventually } from '../support/infra';
import { metricValue } from '../support/metrics';

/** A promise and the function that settles it. */
function signal(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

const LIMIT = 1000;

/**
 * TENANT_TOKEN_LIMITS on the gateway, against the real api and Redis, the
 * provider a local fake: concurrency storms whose served calls never sum past
 * the limit, and serve as many as the worst cases allow; settling to the
 * usage; a dead holder's reservation freed by its lease; other tenants,
 * replays and too-large calls.
 */
describe('the gateway with tenant token limits', () => {
  let gateway: GatewayHarness;
  const chat = (text: string, extra: object = {}) => ({
    model: 'gpt-test',
    messages: [{ role: 'user', content: text }],
    max_tokens: 100,
    ...extra,
  });
  const worstOf = (body: object) =>
    worstCaseTokens(Buffer.byteLength(JSON.stringify(body)), body as Record<string, unknown>);
  const post = (body: object, headers: Record<string, string> = {}, tenant: { key: string } = TENANT_A) =>
    fetch(`${gateway.apiUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: bearer(tenant), 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
  const used = async () => Number((await gateway.redis.hget(tokensKey(TENANT_A.tenant), 'used')) ?? 0);

  beforeAll(async () => {
    gateway = await startGateway({ TENANT_TOKEN_LIMITS: `${TENANT_A.tenant}=${LIMIT}/1d`, GATEWAY_TIMEOUT_S: '5' });
  });
  afterAll(() => gateway.close());
  beforeEach(async () => {
    // Each test starts its tenant's window afresh.
    await gateway.redis.del(tokensKey(TENANT_A.tenant));
  });

  it.each([
    ['without keys, not streaming', false, false],
    ['with keys, not streaming', true, false],
    ['without keys, streaming', false, true],
    ['with keys, streaming', true, true],
  ])(
    '40 concurrent calls %s: as many go upstream as the worst cases allow, the rest get 429, and the usage settles',
    async (_, keyed, stream) => {
      const text = `storm ${keyed} ${stream} ${randomUUID()}`;
      const body = chat(text, stream ? { stream: true, stream_options: { include_usage: true } } : {});
      const worst = worstOf(body);
      const fit = Math.floor(LIMIT / worst);
      expect(fit).toBeGreaterThan(1);
      expect(fit).toBeLessThan(40);
      // The provider holds every call until the storm has been decided: all reservations are live at once.
      const release = signal();
      gateway.replies.set(text, async () => {
        await release.promise;
        return stream
          ? { kind: 'stream', events: completionEvents('a few words', { usage: true }) }
          : { kind: 'complete', content: 'held' };
      });
      const refusalsBefore = await metricValue(gateway.api.server, 'tenant_token_refusals_total', {
        tenant: TENANT_A.tenant,
      });
      const answers = Array.from({ length: 40 }, () =>
        post(body, keyed ? { 'idempotency-key': `tl-${randomUUID()}` } : {}).then(async (res) => ({
          status: res.status,
          retryAfter: res.headers.get('retry-after'),
          body: await res.text(),
        })),
      );
      // The refused ones answer at once; the others wait on the provider.
      await eventually(
        async () =>
          (await metricValue(gateway.api.server, 'tenant_token_refusals_total', { tenant: TENANT_A.tenant })) -
            refusalsBefore ===
            40 - fit && gateway.upstreamCalls(text).length === fit
            ? true
            : undefined,
        10_000,
        'the storm decided',
      );
      release.resolve();
      const done = await Promise.all(answers);
      const served = done.filter((a) => a.status === 200);
      const refused = done.filter((a) => a.status === 429);
      expect(served).toHaveLength(fit);
      expect(refused).toHaveLength(40 - fit);
      for (const r of refused) {
        expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'tenant_token_limit', type: 'rate_limit_error' } });
        // Only live reservations were in the way (nothing settled yet): they free as their calls end, so soon.
        expect(r.retryAfter).toBe('1');
      }
      expect(gateway.upstreamCalls(text)).toHaveLength(fit);
      // Settled to what the provider reported, not to the worst cases: the rest of the window is free again.
      const perCall = stream ? 11 + 3 : 12;
      await eventually(async () => ((await used()) === fit * perCall ? true : undefined), 5000, 'the settled usage');
      const fields = await gateway.redis.hkeys(tokensKey(TENANT_A.tenant));
      expect(fields.filter((f) => f.startsWith('r:'))).toEqual([]);
      await expect(
        metricValue(gateway.api.server, 'tenant_tokens_used', { tenant: TENANT_A.tenant, window: '1d' }),
      ).resolves.toBe(fit * perCall);
    },
  );

  it('gives the rest back when a call used less than it reserved: the next calls fit', async () => {
    const body = chat(`settle small ${randomUUID()}`);
    const worst = worstOf(body);
    const calls = Math.floor(LIMIT / worst) + 3;
    // One after another: each reserves its worst case and settles to 12, so more than LIMIT / worst fit in all.
    for (let i = 0; i < calls; i++) expect((await post(body)).status).toBe(200);
    expect(await used()).toBe(calls * 12);
  });

  it('leaves other tenants and replays alone: a full window refuses new calls only', async () => {
    const text = `replay free ${randomUUID()}`;
    const k = `tl-${randomUUID()}`;
    expect((await post(chat(text), { 'idempotency-key': k })).status).toBe(200);
    // The tenant's window is full of settled tokens: a new call does not fit until the window ends.
    await gateway.redis.hset(tokensKey(TENANT_A.tenant), 'used', LIMIT);
    const refused = await post(chat(`${text} again`));
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(1);
    const replay = await post(chat(text), { 'idempotency-key': k });
    expect(replay.status).toBe(200);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    // Another tenant has no limit (none named for it, no *).
    expect((await post(chat(`${text} for b`), {}, TENANT_B)).status).toBe(200);
    expect(gateway.upstreamCalls(text)).toHaveLength(1);
    expect(gateway.upstreamCalls(`${text} again`)).toHaveLength(0);
  });

  it('refuses at once a call whose worst case alone is over the whole limit: 400, nothing upstream', async () => {
    const text = `too large ${randomUUID()}`;
    const res = await post(chat(text, { max_tokens: LIMIT * 2 }));
    expect(res.status).toBe(400);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(await res.json()).toMatchObject({ error: { code: 'request_exceeds_token_limit' } });
    expect(gateway.upstreamCalls(text)).toHaveLength(0);
  });

  it('frees the reservation of a holder that died within its lease', async () => {
    const limiter = new TenantTokenLimiter(
      gateway.redis,
      { byTenant: new Map([[TENANT_A.tenant, { tokens: LIMIT, windowMs: 86_400_000, window: '1d' }]]) },
      300,
    );
    // A holder reserves the whole limit, and dies without settling.
    const held = await limiter.reserve(TENANT_A.tenant, LIMIT, 'a-dead-holder');
    expect(held?.outcome).toBe('reserved');
    expect((await limiter.reserve(TENANT_A.tenant, 10, 'too-soon'))?.outcome).toBe('refused');
    await eventually(
      async () =>
        (await limiter.reserve(TENANT_A.tenant, 10, 'after-the-lease'))?.outcome === 'reserved' ? true : undefined,
      5000,
      'the lease to end',
    );
    expect(await gateway.redis.hexists(tokensKey(TENANT_A.tenant), 'r:a-dead-holder')).toBe(0);
  });

  it('limits the Responses API alike: max_output_tokens in the worst case, input and output tokens settled', async () => {
    const body = { model: 'gpt-test', input: `a response under a limit ${randomUUID()}`, max_output_tokens: 50 };
    const res = await fetch(`${gateway.apiUrl}/v1/responses`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    const { usage } = (await res.json()) as { usage: { input_tokens: number; output_tokens: number } };
    await eventually(
      async () => ((await used()) === usage.input_tokens + usage.output_tokens ? true : undefined),
      5000,
      'the settled usage',
    );
    const tooLarge = await fetch(`${gateway.apiUrl}/v1/responses`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json' },
      body: JSON.stringify({ ...body, max_output_tokens: LIMIT + 1 }),
    });
    expect(tooLarge.status).toBe(400);
  });

  it('shows the limit in /metrics', async () => {
    await expect(
      metricValue(gateway.api.server, 'tenant_tokens_limit', { tenant: TENANT_A.tenant, window: '1d' }),
    ).resolves.toBe(LIMIT);
  });
});
