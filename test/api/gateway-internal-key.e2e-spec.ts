import type { Redis } from 'ioredis';
import { APIError, APIUserAbortError } from 'openai';
import { PATH_METADATA } from '@nestjs/common/constants';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { classifyLlmError, GatewayAuthError, type LlmClient, llmClientFor } from '@app/llm';
import { AcceptsInternalKey } from '../../apps/api/src/auth/api-key.guard';
import { ChatCompletionsController } from '../../apps/api/src/gateway/chat-completions.controller';
import { ResponsesController } from '../../apps/api/src/gateway/responses.controller';
import { bearer, type ApiHarness, TENANT_A, TENANT_B } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { type GatewayHarness, type GatewayReply, startGateway } from '../support/gateway-harness';
import { eventually, testDataSource } from '../support/infra';
import { startWorker } from '../support/worker-harness';

const INTERNAL_KEY = 'internal-key-0123456789abcdef';
/** The key of a worker rolled out before the api knows it (or still holding it after a rotation). */
const UNKNOWN_INTERNAL_KEY = 'internal-key-the-api-does-not-know';
const GATEWAY = '/v1/chat/completions';
const MiB = 1024 * 1024;

/**
 * The worker's model calls through the api's gateway (issue 21, item 3): the
 * api started with INTERNAL_API_KEY and the real gateway in front of a local
 * fake provider; on the worker's side the LlmClient that LlmModule builds in
 * gateway mode (the official SDK at `<api>/v1` with the internal key and
 * X-Tenant). Effects asserted: upstream calls counted by the fake, records in
 * Redis, the job stream.
 */
describe('the worker’s model calls through the gateway (INTERNAL_API_KEY, X-Tenant)', () => {
  let gateway: GatewayHarness;
  let api: ApiHarness;
  let apiUrl: string;
  let redis: Redis;
  /** The provider's answer per user text, when not the echo. */
  let replies: Map<string, GatewayReply>;
  const key = () => `gw-internal-${randomUUID()}`;
  const ask = (text: string) => ({ model: 'gpt-test', messages: [{ role: 'user' as const, content: text }] });
  const upstreamCalls = (text: string) => gateway.upstreamCalls(text);
  /** The idempotency records whose key ends in `k`, by tenant scope (`idem:<tenant>:POST:<path>:<k>`). */
  const recordsOf = async (k: string) => (await redis.keys(`idem:*${k}`)).sort();

  function post(
    path: string,
    body: unknown,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<globalThis.Response> {
    return fetch(`${apiUrl}${path}`, {
      method: 'POST',
      signal,
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
  }

  /** What LlmModule.forRoot provides to a worker configured with INTERNAL_API_KEY and LLM_GATEWAY_URL. */
  const workerClient = (internalApiKey = INTERNAL_KEY): LlmClient =>
    llmClientFor({
      // Gateway mode wins over the provider: the api holds the provider's credentials.
      provider: 'fake',
      model: 'gpt-test',
      callTimeoutMs: 10_000,
      gatewayUrl: apiUrl,
      internalApiKey,
    });
  const chatOptions = (idempotencyKey: string, signal = new AbortController().signal) => ({
    signal,
    idempotencyKey,
    tenant: TENANT_A.tenant,
  });

  /**
   * The worker killed mid-call: its call reaches the provider, which holds
   * its answer; the worker goes away (its request aborted: the connection
   * closes, as a SIGKILL closes it). Resolves once that happened, with the
   * function that lets the provider answer `content`.
   */
  async function killedMidCall(text: string, k: string, content: string): Promise<{ answer: () => void }> {
    const release = Promise.withResolvers<void>();
    replies.set(text, async () => {
      await release.promise;
      return { kind: 'complete', content };
    });
    const dying = new AbortController();
    const firstCall = workerClient().chat({ messages: ask(text).messages }, chatOptions(k, dying.signal));
    await eventually(() => (upstreamCalls(text).length === 1 ? true : undefined), 5000, 'the call upstream');
    dying.abort();
    await expect(firstCall).rejects.toBeInstanceOf(APIUserAbortError);
    return { answer: () => release.resolve() };
  }

  /** What a call that failed threw. */
  const failureOf = (call: Promise<unknown>): Promise<unknown> =>
    call.then(
      () => undefined,
      (e: unknown) => e,
    );

  beforeAll(async () => {
    gateway = await startGateway({ INTERNAL_API_KEY: INTERNAL_KEY });
    ({ api, apiUrl, redis, replies } = gateway);
  });
  afterAll(() => gateway.close());

  describe('the guard', () => {
    it('takes the internal key with X-Tenant as that tenant: its own key replays the call, another tenant’s does not', async () => {
      const k = key();
      const text = `internal then tenant ${k}`;
      const first = await post(GATEWAY, ask(text), {
        authorization: bearer({ key: INTERNAL_KEY }),
        'x-tenant': TENANT_A.tenant,
        'idempotency-key': k,
      });
      expect(first.status).toBe(200);
      const completion = await first.json();
      expect(await recordsOf(k)).toEqual([`idem:${TENANT_A.tenant}:POST:${GATEWAY}:${k}`]);
      // Upstream sees the api's provider key, never the internal key or X-Tenant.
      const [call] = upstreamCalls(text);
      expect(call.headers.authorization).toBe('Bearer sk-upstream');
      expect(call.headers['x-tenant']).toBeUndefined();

      const own = await post(GATEWAY, ask(text), { authorization: bearer(TENANT_A), 'idempotency-key': k });
      expect(own.status).toBe(200);
      expect(own.headers.get('idempotent-replayed')).toBe('true');
      expect(await own.json()).toEqual(completion);
      expect(upstreamCalls(text)).toHaveLength(1);

      const other = await post(GATEWAY, ask(text), { authorization: bearer(TENANT_B), 'idempotency-key': k });
      expect(other.status).toBe(200);
      expect(other.headers.get('idempotent-replayed')).toBeNull();
      expect(upstreamCalls(text)).toHaveLength(2);
    });

    it.each([
      ['X-Tenant with a tenant key', { authorization: bearer(TENANT_A), 'x-tenant': TENANT_B.tenant }, /internal key/],
      [
        'X-Tenant naming the tenant key’s own tenant',
        { authorization: bearer(TENANT_A), 'x-tenant': TENANT_A.tenant },
        /internal key/,
      ],
      ['the internal key without X-Tenant', { authorization: bearer({ key: INTERNAL_KEY }) }, /X-Tenant/],
      [
        'a wrong internal key',
        { authorization: bearer({ key: `${INTERNAL_KEY}x` }), 'x-tenant': TENANT_A.tenant },
        /not valid/,
      ],
      [
        'X-Tenant naming no configured tenant',
        { authorization: bearer({ key: INTERNAL_KEY }), 'x-tenant': 'tenant-z' },
        /API_KEYS/,
      ],
    ])('refuses %s: 401 in OpenAI’s envelope, nothing upstream, no record', async (_, headers, message) => {
      const k = key();
      const text = `refused ${k}`;
      const res = await post(GATEWAY, ask(text), { ...headers, 'idempotency-key': k });
      expect(res.status).toBe(401);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(await res.json()).toMatchObject({
        error: { type: 'authentication_error', code: 'invalid_api_key', message: expect.stringMatching(message) },
      });
      expect(upstreamCalls(text)).toHaveLength(0);
      expect(await recordsOf(k)).toEqual([]);
    });

    it('refuses the internal key on every other route, and X-Tenant there too: 401 problem+json, nothing enqueued', async () => {
      const jobs = async () => (await redis.keys('*summaries*:jobs')).length;
      const before = await jobs();
      const body = { text: 'Some text to summarise.', notify: 'someone@example.com' };
      for (const headers of [
        { authorization: bearer({ key: INTERNAL_KEY }), 'x-tenant': TENANT_A.tenant },
        { authorization: bearer(TENANT_A), 'x-tenant': TENANT_A.tenant },
      ]) {
        const k = key();
        const res = await post('/v1/summaries', body, { ...headers, 'idempotency-key': k });
        expect(res.status).toBe(401);
        expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
        expect(await recordsOf(k)).toEqual([]);
      }
      expect(await jobs()).toBe(before);
      // The same request with the tenant's own key alone is accepted (the refusals were about the credentials).
      const ok = await post('/v1/summaries', body, { authorization: bearer(TENANT_A), 'idempotency-key': key() });
      expect(ok.status).toBe(202);
    });

    it('is taken by the gateway’s routes only: no other route of the app carries @AcceptsInternalKey()', () => {
      const reflector = api.app.get(Reflector);
      const scanner = new MetadataScanner();
      const taking: string[] = [];
      let routes = 0;
      for (const wrapper of api.app.get(DiscoveryService).getControllers()) {
        const type = wrapper.metatype;
        if (typeof type !== 'function') continue;
        const prototype = type.prototype as Record<string, unknown>;
        for (const name of scanner.getAllMethodNames(prototype)) {
          const handler = prototype[name];
          if (typeof handler !== 'function' || !Reflect.hasMetadata(PATH_METADATA, handler)) continue;
          routes++;
          if (reflector.getAllAndOverride(AcceptsInternalKey, [handler, type]) === true)
            taking.push(`${type.name}.${name}`);
        }
      }
      // The whole app was seen (summaries, refunds, triage, runs, admin, health, …), not only the gateway.
      expect(routes).toBeGreaterThan(10);
      expect(taking.sort()).toEqual([`${ChatCompletionsController.name}.create`, `${ResponsesController.name}.create`]);
    });
  });

  describe('the worker’s client in gateway mode', () => {
    it('makes one upstream call for two chat() calls with one key, and gets the same completion', async () => {
      const k = `wf:${randomUUID()}:classify:0`;
      const text = `two chats ${k}`;
      const llm = workerClient();
      const first = await llm.chat({ messages: ask(text).messages }, chatOptions(k));
      const second = await llm.chat({ messages: ask(text).messages }, chatOptions(k));
      expect(second).toEqual(first);
      expect(first.choices[0].message.content).toBe(`Echo: ${text}`);
      expect(upstreamCalls(text)).toHaveLength(1);
      // Recorded in the tenant's own scope, so its replays and running calls are the tenant's.
      expect(await recordsOf(k)).toEqual([`idem:${TENANT_A.tenant}:POST:${GATEWAY}:${k}`]);
    });

    it('summarize() names the job’s tenant and key too, so summaries work on the gateway path', async () => {
      const k = `summary:${randomUUID()}`;
      const text = `a summary through the gateway ${k}`;
      const llm = workerClient();
      const options = { signal: new AbortController().signal, tenant: TENANT_A.tenant, idempotencyKey: k };
      await expect(llm.summarize(text, options)).resolves.toBe(`Echo: ${text}`);
      await expect(llm.summarize(text, options)).resolves.toBe(`Echo: ${text}`);
      expect(upstreamCalls(text)).toHaveLength(1);
      expect(await recordsOf(k)).toEqual([`idem:${TENANT_A.tenant}:POST:${GATEWAY}:${k}`]);
    });

    it('gets the gateway’s 401 for a key the api does not know (a rollout, a rotation) as a redelivery, nothing upstream', async () => {
      const text = `unknown key ${randomUUID()}`;
      const err = await failureOf(
        workerClient(UNKNOWN_INTERNAL_KEY).chat({ messages: ask(text).messages }, chatOptions(key())),
      );
      expect(err).toBeInstanceOf(GatewayAuthError);
      expect((err as GatewayAuthError).cause).toBeInstanceOf(APIError);
      expect(classifyLlmError(err)).toEqual({ kind: 'gateway_auth', retryable: true, status: 401 });
      expect((err as Error).message).toMatch(/The API key is not valid/);
      expect(upstreamCalls(text)).toHaveLength(0);
    });

    it('gets the gateway’s 401 for a call without a tenant the same way: the gateway refused the credentials', async () => {
      const text = `no tenant ${randomUUID()}`;
      const err = await failureOf(
        workerClient().chat(
          { messages: ask(text).messages },
          { signal: new AbortController().signal, idempotencyKey: key() },
        ),
      );
      expect(err).toBeInstanceOf(GatewayAuthError);
      expect(classifyLlmError(err)).toMatchObject({ kind: 'gateway_auth', retryable: true, status: 401 });
      expect((err as Error).message).toMatch(/must name the tenant in one X-Tenant header/);
      expect(upstreamCalls(text)).toHaveLength(0);
    });

    it.each([401, 403])(
      'keeps the provider’s own %i, relayed by the gateway, a permanent failure (as when called directly)',
      async (status) => {
        const text = `provider refuses ${randomUUID()}`;
        // Even with WWW-Authenticate: the gateway relays a fixed list of provider headers, not that one.
        replies.set(text, () => ({
          kind: 'error',
          status,
          headers: { 'www-authenticate': 'Bearer realm="provider"' },
        }));
        const err = await failureOf(workerClient().chat({ messages: ask(text).messages }, chatOptions(key())));
        expect(err).toBeInstanceOf(APIError);
        expect(err).not.toBeInstanceOf(GatewayAuthError);
        expect(classifyLlmError(err)).toMatchObject({ kind: 'client', retryable: false, status });
        expect(upstreamCalls(text)).toHaveLength(1);
      },
    );

    /*
     * The "worker killed mid-call" guarantee. Timeline: the worker's call
     * reaches the provider, which holds its answer; the worker goes away;
     * its redelivery calls again with the same key while the provider still
     * holds the answer, and is attached to the running call; the provider
     * answers once, and the retry gets that completion. One upstream call.
     */
    it('answers the retry of a call whose caller went away mid-call from the running call: one upstream call', async () => {
      const k = `wf:${randomUUID()}:draft:0`;
      const text = `killed mid-call ${k}`;
      const { answer } = await killedMidCall(text, k, 'answered once');
      // The record is still running: the gateway keeps the upstream call going for a retry.
      const [record] = await recordsOf(k);
      expect(await redis.hget(record, 'state')).toBe('running');

      const retry = workerClient().chat({ messages: ask(text).messages }, chatOptions(k));
      // The retry waits on the running call (it registered as a follower in the record's frames) …
      const token = await redis.hget(record, 'token');
      const frames = `{${record}}:f:${token}`;
      await eventually(
        async () => ((await redis.xrange(frames, '-', '+')).some(([, f]) => f[0] === 'w') ? true : undefined),
        5000,
        'the retry attached to the running call',
      );
      // … and gets its completion once the provider answers.
      answer();
      const completion = await retry;
      expect(completion.choices[0].message.content).toBe('answered once');
      expect(upstreamCalls(text)).toHaveLength(1);
      expect(upstreamCalls(text)[0].closedEarly).toBe(false);
      expect(await redis.hget(record, 'state')).toBe('completed');
      // And a later redelivery is answered from the record.
      await expect(workerClient().chat({ messages: ask(text).messages }, chatOptions(k))).resolves.toEqual(completion);
      expect(upstreamCalls(text)).toHaveLength(1);
    });

    it('answers the retry from the record when the call finished after its caller went away: one upstream call', async () => {
      const k = `wf:${randomUUID()}:draft:0`;
      const text = `finished after the kill ${k}`;
      const { answer } = await killedMidCall(text, k, 'stored for the retry');
      answer();
      const record = `idem:${TENANT_A.tenant}:POST:${GATEWAY}:${k}`;
      await eventually(
        async () => ((await redis.hget(record, 'state')) === 'completed' ? true : undefined),
        5000,
        'the record stored',
      );
      const completion = await workerClient().chat({ messages: ask(text).messages }, chatOptions(k));
      expect(completion.choices[0].message.content).toBe('stored for the retry');
      expect(upstreamCalls(text)).toHaveLength(1);
    });

    it('gets the gateway’s 409 for a key still running that it cannot attach to, classified retryable after Retry-After', async () => {
      // A keyed answer over the 4 MiB storable size is relayed, not stored, and holds its key while it
      // runs: a duplicate cannot be attached and gets 409 (gateway.e2e-spec's "too-large whole answer").
      const k = `wf:${randomUUID()}:classify:0`;
      const text = `held 409 ${k}`;
      const reached = Promise.withResolvers<void>();
      const resume = Promise.withResolvers<void>();
      replies.set(text, () => ({
        kind: 'huge',
        contentType: 'application/json',
        bytes: 6 * MiB,
        prefix: '{"id":"chatcmpl-held","object":"chat.completion","choices":[{"index":0,"message":{"content":"',
        suffix: '"}}]}',
        pause: { afterBytes: 5 * MiB, reached: reached.resolve, until: resume.promise },
      }));
      // The first caller sends what chat() sends (the fingerprint covers the body): model, messages, stream false.
      const first = await post(
        GATEWAY,
        { ...ask(text), stream: false },
        { authorization: bearer({ key: INTERNAL_KEY }), 'x-tenant': TENANT_A.tenant, 'idempotency-key': k },
      );
      expect(first.status).toBe(200);
      const drained = first.arrayBuffer();
      await reached.promise;

      const err = await failureOf(workerClient().chat({ messages: ask(text).messages }, chatOptions(k)));
      expect(err).toBeInstanceOf(APIError);
      const classified = classifyLlmError(err);
      expect(classified).toMatchObject({ kind: 'conflict', retryable: true, status: 409 });
      expect(classified.retryAfterMs).toBeGreaterThanOrEqual(1000);
      expect(upstreamCalls(text)).toHaveLength(1);
      resume.resolve();
      expect((await drained).byteLength).toBe(6 * MiB);
    });
  });

  describe('the worker app in gateway mode', () => {
    it('summarises a job through the gateway as the job’s tenant: one upstream call, the provider never called directly', async () => {
      // The worker's own provider settings point elsewhere: with INTERNAL_API_KEY and LLM_GATEWAY_URL they are unused.
      const direct = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'called directly' })).start();
      const worker = await startWorker({
        modelUrl: direct.baseUrl,
        env: { INTERNAL_API_KEY: INTERNAL_KEY, LLM_GATEWAY_URL: apiUrl, OPENAI_MODEL: 'gpt-test' },
      });
      const db = await testDataSource();
      try {
        const text = `A text for the worker through the gateway ${randomUUID()}.`;
        replies.set(text, () => ({ kind: 'complete', content: 'Summarised through the gateway.' }));
        const accepted = await post(
          '/v1/summaries',
          { text, notify: 'reader@example.com' },
          { authorization: bearer(TENANT_A), 'idempotency-key': key() },
        );
        expect(accepted.status).toBe(202);
        const { job_id: jobId } = (await accepted.json()) as { job_id: string };
        const outcomes = await worker.consumer.runOnce();
        expect(outcomes.map((o) => o.outcome)).not.toContain('dead_lettered');
        const rows = await db.query<{ tenant: string; summary: string }[]>(
          'SELECT tenant, summary FROM summaries WHERE job_id = $1',
          [jobId],
        );
        expect(rows).toEqual([{ tenant: TENANT_A.tenant, summary: 'Summarised through the gateway.' }]);
        expect(upstreamCalls(text)).toHaveLength(1);
        expect(direct.calls).toBe(0);
        // The engine's default key: the run, the step, the call's place and its request's digest.
        const [record, ...more] = await redis.keys(`idem:*wf:${jobId}:*`);
        expect(more).toEqual([]);
        expect(record).toMatch(
          new RegExp(`^idem:${TENANT_A.tenant}:POST:${GATEWAY}:wf:${jobId}:summarize:0:[0-9a-f]{16}$`),
        );
        expect(await redis.hget(record, 'state')).toBe('completed');
      } finally {
        await worker.close();
        await db.destroy();
        await direct.stop();
      }
    });

    /*
     * Rollout skew, as docs/operations.md's Upgrading tells it: a worker that
     * has INTERNAL_API_KEY before the api does (or still the old one while
     * the key rotates) is refused by the gateway. Timeline: the job is
     * enqueued; worker A, whose key the api does not know, takes it and is
     * refused (401): the delivery fails as transient, the entry stays pending,
     * nothing is dead-lettered or marked failed, nothing goes upstream; worker
     * B, with the api's key (the rollout done), takes the entry over once
     * A left it idle and stores the summary with one upstream call.
     */
    it('leaves a job refused by the gateway (a key the api does not know yet) for a redelivery, which succeeds', async () => {
      const direct = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'called directly' })).start();
      const db = await testDataSource();
      const workerEnv = { LLM_GATEWAY_URL: apiUrl, OPENAI_MODEL: 'gpt-test', LLM_MAX_ATTEMPTS: '1' };
      const ahead = await startWorker({
        modelUrl: direct.baseUrl,
        env: { ...workerEnv, INTERNAL_API_KEY: UNKNOWN_INTERNAL_KEY },
      });
      let aheadRunning = true;
      try {
        const text = `A job while the key rolls out ${randomUUID()}.`;
        replies.set(text, () => ({ kind: 'complete', content: 'Summarised after the rollout.' }));
        const accepted = await post(
          '/v1/summaries',
          { text, notify: 'reader@example.com' },
          { authorization: bearer(TENANT_A), 'idempotency-key': key() },
        );
        expect(accepted.status).toBe(202);
        const { job_id: jobId } = (await accepted.json()) as { job_id: string };
        const summaryOf = () =>
          db.query<{ summary: string }[]>('SELECT summary FROM summaries WHERE job_id = $1', [jobId]);

        const refused = await ahead.consumer.runOnce();
        expect(refused.map((o) => o.outcome)).toEqual(['transient']);
        expect(upstreamCalls(text)).toHaveLength(0);
        expect(await summaryOf()).toEqual([]);
        const status = await fetch(`${apiUrl}/v1/summaries/${jobId}`, { headers: { authorization: bearer(TENANT_A) } });
        expect(((await status.json()) as { status: string }).status).not.toBe('failed');
        await ahead.close();
        aheadRunning = false;

        const current = await startWorker({
          modelUrl: direct.baseUrl,
          env: { ...workerEnv, INTERNAL_API_KEY: INTERNAL_KEY, CLAIM_IDLE_MS: '100' },
        });
        try {
          // Polled: the entry is taken over once it has been idle for CLAIM_IDLE_MS.
          const redelivered = await eventually(
            async () => (await current.consumer.runOnce()).find((o) => o.id === refused[0].id),
            5000,
            'the redelivery of the refused job',
          );
          expect(redelivered).toMatchObject({ deliveries: 2, outcome: 'done' });
        } finally {
          await current.close();
        }
        expect(await summaryOf()).toEqual([{ summary: 'Summarised after the rollout.' }]);
        expect(upstreamCalls(text)).toHaveLength(1);
        expect(direct.calls).toBe(0);
      } finally {
        if (aheadRunning) await ahead.close();
        await db.destroy();
        await direct.stop();
      }
    });
  });
});
