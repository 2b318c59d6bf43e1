import type { Redis } from 'ioredis';
import OpenAI, { APIError } from 'openai';
import { randomUUID } from 'node:crypto';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import type { ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { AddressInfo } from 'node:net';
import { legacyFingerprint, RedisIdempotencyStore } from '@app/idempotency';
import { BROKEN_STREAM_EVENT } from '../../apps/api/src/gateway/openai-errors';
import { bearer, type ApiHarness, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { completionEvents, FakeOpenAiServer } from '../support/fake-openai-server';
import { type GatewayHarness, type GatewayReply, startGateway } from '../support/gateway-harness';
import { recordedFrames } from '../support/frame-log';
import { eventually, freePort, testDatabaseUrl, testRedisUrl } from '../support/infra';

/** Polls until `condition` holds. */
const until = (condition: () => boolean, what = 'the condition') =>
  eventually(() => (condition() ? true : undefined), 5000, what);
import { metricValue } from '../support/metrics';

/**
 * POST /v1/chat/completions with the official `openai` SDK as the client,
 * pointed at the api, and a local HTTP server playing the provider, SSE
 * included. Effects asserted: upstream calls, the bytes each side saw,
 * records in Redis, token counters.
 */
describe('the gateway: POST /v1/chat/completions', () => {
  let provider: FakeOpenAiServer;
  let api: ApiHarness;
  let apiUrl: string;
  let redis: Redis;
  const key = () => `gw-${randomUUID()}`;
  const sdk = (tenant: { key: string } = TENANT_A, url = apiUrl) =>
    new OpenAI({ apiKey: tenant.key, baseURL: `${url}/v1`, maxRetries: 0 });
  const ask = (text: string) => ({ model: 'gpt-test', messages: [{ role: 'user' as const, content: text }] });
  /** The provider's answer per user text; a stream by default for stream requests. */
  let replies: Map<string, GatewayReply>;
  let gateway: GatewayHarness;

  async function post(
    body: unknown,
    headers: Record<string, string> = {},
    tenant: { key: string } = TENANT_A,
    url = apiUrl,
    signal?: AbortSignal,
  ): Promise<globalThis.Response> {
    return fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      signal,
      headers: { authorization: bearer(tenant), 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  }

  /** Until the running call of key `k` has its head and `events` in its record, no more: attachable mid-stream. */
  const recorded = (k: string, events: readonly string[]) =>
    eventually(
      async () =>
        (await recordedFrames(redis, `idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)) === events.join('')
          ? true
          : undefined,
      5000,
      `the head and the first ${events.length} events in the record`,
    );
  /**
   * Resolves once the api (it runs in this process) has closed its response to the request carrying Idempotency-Key
   * `k`: answered, or its caller's disconnect seen. Call it before the request is sent.
   */
  function closedAtTheApi(k: string): Promise<void> {
    return new Promise((resolve) => {
      const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
        if (req.headers['idempotency-key'] !== k) return;
        api.server.off('request', onRequest);
        res.once('close', () => resolve());
      };
      api.server.on('request', onRequest);
    });
  }
  /**
   * Resolves once the api's next call to the provider is over on the api's side: the provider's body read to its
   * end and the socket back in the pool, or the socket closed. node:http's diagnostics channel shows the api's
   * requests (it runs in this process); the request's 'close' comes in the same tick as, just before, the socket's
   * 'free', so the pool has it by the time this resolves. Call it before the call is made.
   */
  function nextProviderCallOver(): Promise<void> {
    const host = new URL(provider.baseUrl).host;
    return new Promise((resolve) => {
      const onStart = (message: unknown): void => {
        const { request } = message as { request: ClientRequest };
        if (request.getHeader('host') !== host) return;
        unsubscribe('http.client.request.start', onStart);
        request.once('close', () => resolve());
      };
      subscribe('http.client.request.start', onStart);
    });
  }

  beforeAll(async () => {
    gateway = await startGateway();
    ({ provider, api, apiUrl, redis, replies } = gateway);
  });
  afterAll(() => gateway.close());

  describe('without streaming', () => {
    it('replays the stored answer byte for byte, with one upstream call that carried a key of its own', async () => {
      const k = key();
      const body = { ...ask('non-stream replay'), temperature: 0.2 };
      const first = await sdk()
        .chat.completions.create(body, { headers: { 'Idempotency-Key': k } })
        .withResponse();
      const again = await post(body, { 'idempotency-key': k });
      const calls = provider.requests.filter((r) => r.userText === 'non-stream replay');
      expect(calls).toHaveLength(1);
      expect(first.data.choices[0].message.content).toBe('Echo: non-stream replay');
      expect(first.response.headers.get('idempotent-replayed')).toBeNull();
      expect(again.status).toBe(200);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.headers.get('content-type')).toBe('application/json');
      expect(JSON.parse(await again.text())).toEqual(first.data);
      const raw = await post(body, { 'idempotency-key': k });
      const original = JSON.stringify(first.data);
      expect(await raw.text()).toBe(original); // the fake provider's bytes are JSON.stringify's
      // The provider gets an Idempotency-Key of its own for the operation:
      // stable for the tenant's key, never the raw key (tenants share our account).
      const upstreamKey = calls[0].headers['idempotency-key'];
      expect(upstreamKey).toMatch(/^[0-9a-f-]{36}$/);
      expect(calls[0].headers.authorization).toBe('Bearer sk-upstream');
    });

    it('sends the body upstream exactly as the client wrote it', async () => {
      const raw =
        '{ "messages" : [{"content":"raw bytes ☃","role":"user"}],\n "model":"gpt-test", "x_custom": [1, 2.50, null] }';
      const res = await post(raw, { 'idempotency-key': key() });
      expect(res.status).toBe(200);
      const seen = provider.requests.find((r) => r.userText === 'raw bytes ☃');
      expect(seen?.rawBody.toString('utf8')).toBe(raw);
    });

    it('takes bodies over 1 MiB (up to 10) from a tenant only', async () => {
      const big = { ...ask('big body'), metadata: { padding: 'x'.repeat(2 * 1024 * 1024) } };
      const anonymous = await fetch(`${apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer not-a-key-0123456789' },
        body: JSON.stringify(big),
      });
      expect(anonymous.status).toBe(413);
      expect(await anonymous.json()).toMatchObject({ error: { code: 'payload_too_large' } });
      expect(provider.requests.some((r) => r.userText === 'big body')).toBe(false);
      const tenant = await post(big, { 'idempotency-key': key() });
      expect(tenant.status).toBe(200);
      expect(provider.requests.find((r) => r.userText === 'big body')?.rawBody.length).toBe(
        Buffer.byteLength(JSON.stringify(big)),
      );
    });

    it('keeps the keys of different tenants apart, upstream too', async () => {
      const k = key();
      const a = await post(ask('tenant keys'), { 'idempotency-key': k }, TENANT_A);
      const b = await post(ask('tenant keys'), { 'idempotency-key': k }, TENANT_B);
      expect(a.headers.get('idempotent-replayed')).toBeNull();
      expect(b.headers.get('idempotent-replayed')).toBeNull();
      const calls = provider.requests.filter((r) => r.userText === 'tenant keys');
      expect(calls).toHaveLength(2);
      expect(calls[0].headers['idempotency-key']).not.toBe(calls[1].headers['idempotency-key']);
    });

    it('forwards a call without a key every time, and keeps no record', async () => {
      const before = (await redis.keys('idem:*')).length;
      await sdk().chat.completions.create(ask('no key'));
      await sdk().chat.completions.create(ask('no key'));
      expect(provider.requests.filter((r) => r.userText === 'no key')).toHaveLength(2);
      expect(
        provider.requests
          .filter((r) => r.userText === 'no key')
          .every((r) => r.headers['idempotency-key'] === undefined),
      ).toBe(true);
      expect((await redis.keys('idem:*')).length).toBe(before);
    });

    it('gives a duplicate that arrives while the call runs that call’s answer, with one upstream call', async () => {
      const k = key();
      replies.set('slow answer', { kind: 'complete', content: 'slow but once', delayMs: 600 });
      const first = post(ask('slow answer'), { 'idempotency-key': k });
      await until(() => provider.requests.some((r) => r.userText === 'slow answer'));
      const duplicate = await sdk()
        .chat.completions.create(ask('slow answer'), { headers: { 'Idempotency-Key': k } })
        .withResponse();
      expect(duplicate.response.headers.get('idempotent-replayed')).toBe('true');
      expect(duplicate.data.choices[0].message.content).toBe('slow but once');
      expect(await (await first).json()).toEqual(duplicate.data);
      expect(provider.requests.filter((r) => r.userText === 'slow answer')).toHaveLength(1);
    });

    it('answers a key reused with another body, or stream instead of not, 422 in OpenAI’s envelope', async () => {
      const k = key();
      await sdk().chat.completions.create(ask('reuse me'), { headers: { 'Idempotency-Key': k } });
      const changed = sdk().chat.completions.create(
        { ...ask('reuse me'), temperature: 1 },
        { headers: { 'Idempotency-Key': k } },
      );
      await expect(changed).rejects.toMatchObject({
        status: 422,
        code: 'idempotency_key_reused',
        type: 'invalid_request_error',
      });
      const streamed = sdk().chat.completions.create(
        { ...ask('reuse me'), stream: true },
        { headers: { 'Idempotency-Key': k } },
      );
      await expect(streamed).rejects.toBeInstanceOf(OpenAI.UnprocessableEntityError);
      expect(provider.requests.filter((r) => r.userText === 'reuse me')).toHaveLength(1);
    });

    it('passes a provider 429 through, stores nothing, and lets the retry run', async () => {
      const k = key();
      let n = 0;
      replies.set('rate limited', () =>
        ++n === 1
          ? { kind: 'error', status: 429, headers: { 'retry-after': '7', 'x-ratelimit-remaining-requests': '0' } }
          : { kind: 'complete', content: 'second time lucky' },
      );
      const limited = await post(ask('rate limited'), { 'idempotency-key': k });
      expect(limited.status).toBe(429);
      expect(limited.headers.get('retry-after')).toBe('7');
      expect(limited.headers.get('x-ratelimit-remaining-requests')).toBe('0');
      expect(await limited.json()).toEqual({ error: { message: 'fake error 429', type: 'fake', code: null } });
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      const retried = await sdk().chat.completions.create(ask('rate limited'), { headers: { 'Idempotency-Key': k } });
      expect(retried.choices[0].message.content).toBe('second time lucky');
      expect(provider.requests.filter((r) => r.userText === 'rate limited')).toHaveLength(2);
    });

    it('counts the tokens of a call once, not for its replays', async () => {
      const tokens = () =>
        metricValue(api.server, 'gateway_tokens_total', { tenant: TENANT_B.tenant, kind: 'completion' });
      const before = await tokens();
      const k = key();
      await post(ask('count my tokens'), { 'idempotency-key': k }, TENANT_B);
      await post(ask('count my tokens'), { 'idempotency-key': k }, TENANT_B);
      expect((await tokens()) - before).toBe(5);
      await expect(metricValue(api.server, 'gateway_calls_total', { outcome: 'replayed' })).resolves.toBeGreaterThan(0);
    });
  });

  describe('streaming', () => {
    const streamOf = (text: string) => ({
      ...ask(text),
      stream: true as const,
      stream_options: { include_usage: true },
    });

    it('replays a stream as the same events in order, through data: [DONE], parsed by the SDK', async () => {
      const k = key();
      const events = completionEvents('Streams are stored event by event.', { id: 'chatcmpl-replay', usage: true });
      replies.set('stream replay', { kind: 'stream', events });
      const first = await post(streamOf('stream replay'), { 'idempotency-key': k });
      expect(first.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
      expect(await first.text()).toBe(events.join(''));
      const stream = await sdk().chat.completions.create(streamOf('stream replay'), {
        headers: { 'Idempotency-Key': k },
      });
      const chunks = [];
      for await (const chunk of stream) chunks.push(chunk);
      expect(chunks.map((c) => c.id)).toEqual(Array(events.length - 1).fill('chatcmpl-replay'));
      expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('Streams are stored event by event.');
      expect(chunks.at(-1)?.usage).toEqual({ prompt_tokens: 11, completion_tokens: 6, total_tokens: 17 });
      const raw = await post(streamOf('stream replay'), { 'idempotency-key': k });
      expect(raw.headers.get('idempotent-replayed')).toBe('true');
      expect(await raw.text()).toBe(events.join(''));
      expect(provider.requests.filter((r) => r.userText === 'stream replay')).toHaveLength(1);
    });

    it('keeps the provider’s connection for the next call after a stream ends', async () => {
      replies.set('one connection', { kind: 'stream', events: completionEvents('reuse the socket'), endAfterMs: 50 });
      for (let i = 0; i < 3; i++) {
        const over = nextProviderCallOver();
        expect(await (await post(streamOf('one connection'), { 'idempotency-key': key() })).text()).toMatch(
          /\[DONE\]\n\n$/,
        );
        // The provider ends its body 50 ms after [DONE]: the next call goes once the api has read that end.
        await over;
      }
      // Without a key too: the caller leaving once its answer is whole ends nothing upstream.
      for (let i = 0; i < 2; i++) {
        const over = nextProviderCallOver();
        expect(await (await post(streamOf('one connection'), {})).text()).toMatch(/\[DONE\]\n\n$/);
        await over;
      }
      const seen = provider.requests.filter((r) => r.userText === 'one connection');
      expect(seen).toHaveLength(5);
      expect(new Set(seen.map((r) => r.connection)).size).toBe(1);
    });

    it('ends the caller’s stream with an error event when the provider’s breaks, and leaves the key free', async () => {
      const k = key();
      let n = 0;
      const events = completionEvents('broken then whole');
      replies.set('broken stream', () =>
        ++n === 1 ? { kind: 'stream', events, breakAfter: 3 } : { kind: 'stream', events },
      );
      const stream = await sdk().chat.completions.create(streamOf('broken stream'), {
        headers: { 'Idempotency-Key': k },
      });
      const seen: string[] = [];
      let error: unknown;
      try {
        for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? '');
      } catch (err) {
        error = err;
      }
      expect(error).toBeInstanceOf(APIError);
      expect((error as APIError).message).toMatch(/before data: \[DONE\]/);
      expect(seen.length).toBe(3);
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      const retry = await post(streamOf('broken stream'), { 'idempotency-key': k });
      expect(retry.headers.get('idempotent-replayed')).toBeNull();
      expect(await retry.text()).toBe(events.join(''));
      expect(provider.requests.filter((r) => r.userText === 'broken stream')).toHaveLength(2);
    });

    it('ends a stream whose event is not the API’s (data that is no JSON object) with the error event; nothing stored', async () => {
      const k = key();
      const events = completionEvents('half a stream');
      let n = 0;
      replies.set('not an event', () =>
        ++n === 1
          ? { kind: 'stream', events: [...events.slice(0, 2), 'data: <html>oops</html>\n\n', ...events.slice(2)] }
          : { kind: 'stream', events },
      );
      const first = await post(streamOf('not an event'), { 'idempotency-key': k });
      expect(await first.text()).toBe(events.slice(0, 2).join('') + BROKEN_STREAM_EVENT);
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      const retry = await post(streamOf('not an event'), { 'idempotency-key': k });
      expect(await retry.text()).toBe(events.join(''));
      expect(provider.requests.filter((r) => r.userText === 'not an event')).toHaveLength(2);
    });

    it('answers a whole 2xx that is not a JSON object (a proxy’s HTML page) with 502 upstream_malformed; nothing stored', async () => {
      const k = key();
      replies.set('html page', {
        kind: 'raw',
        status: 200,
        headers: { 'content-type': 'text/html' },
        body: '<html></html>',
      });
      const res = await post(ask('html page'), { 'idempotency-key': k });
      expect(res.status).toBe(502);
      expect(await res.json()).toMatchObject({ error: { code: 'upstream_malformed' } });
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
    });

    it('attaches a duplicate that arrives mid-stream: the events so far, then the live ones, from one upstream call', async () => {
      const k = key();
      const events = completionEvents('one call, two callers, the same stream of words', { usage: true });
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('attach me', { kind: 'stream', events, gate: (i) => (i === 3 ? held : Promise.resolve()) });
      const first = post(streamOf('attach me'), { 'idempotency-key': k }).then(async (r) => ({
        headers: r.headers,
        text: await r.text(),
      }));
      await until(() => provider.requests.some((r) => r.userText === 'attach me'));
      await recorded(k, events.slice(0, 3));
      // Its head came while the call is held: it is attached to the running call, not a replay of a finished one.
      const duplicate = await post(streamOf('attach me'), { 'idempotency-key': k }).then((r) => ({
        headers: r.headers,
        text: r.text(),
      }));
      release();
      const a = await first;
      expect(a.text).toBe(events.join(''));
      expect(await duplicate.text).toBe(events.join(''));
      expect(duplicate.headers.get('idempotent-replayed')).toBe('true');
      expect(provider.requests.filter((r) => r.userText === 'attach me')).toHaveLength(1);
    });

    it('keeps the upstream call running for a caller that aborts after two chunks; its retry gets the whole stream', async () => {
      const k = key();
      const events = completionEvents('the caller left but the model kept talking');
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('abort me', { kind: 'stream', events, gate: (i) => (i === 2 ? held : Promise.resolve()) });
      const controller = new AbortController();
      const callerGone = closedAtTheApi(k);
      const stream = await sdk().chat.completions.create(streamOf('abort me'), {
        headers: { 'Idempotency-Key': k },
        signal: controller.signal,
      });
      let read = 0;
      for await (const _chunk of stream) {
        if (++read === 2) {
          controller.abort();
          break;
        }
      }
      // The api has seen the caller leave before the provider goes on.
      await callerGone;
      release();
      const seen = provider.requests.find((r) => r.userText === 'abort me');
      // The retry may arrive while the call still runs: it is attached, and gets the same events.
      const retry = await post(streamOf('abort me'), { 'idempotency-key': k });
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.text()).toBe(events.join(''));
      expect(seen?.closedEarly).toBe(false);
      expect(provider.requests.filter((r) => r.userText === 'abort me')).toHaveLength(1);
    });

    it('stores the stream of a caller that went away before its first chunk; the retry gets it whole', async () => {
      const k = key();
      const events = completionEvents('nobody was there for the first word');
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('left early', { kind: 'stream', events, gate: (i) => (i === 0 ? held : Promise.resolve()) });
      const controller = new AbortController();
      const abandoned = post(streamOf('left early'), { 'idempotency-key': k }).catch(() => undefined);
      void abandoned;
      const gone = closedAtTheApi(`${k}-2`);
      const leaving = fetch(`${apiUrl}/v1/chat/completions`, {
        method: 'POST',
        signal: controller.signal,
        headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': `${k}-2` },
        body: JSON.stringify(streamOf('left early')),
      }).catch(() => undefined);
      await until(() => provider.requests.filter((r) => r.userText === 'left early').length === 2);
      controller.abort();
      await leaving;
      // The api has seen the caller leave before the provider sends its first event.
      await gone;
      release();
      await abandoned;
      const retry = await post(streamOf('left early'), { 'idempotency-key': `${k}-2` });
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.text()).toBe(events.join(''));
      expect(provider.requests.filter((r) => r.userText === 'left early')).toHaveLength(2);
      expect(provider.requests.filter((r) => r.userText === 'left early').every((r) => !r.closedEarly)).toBe(true);
    });

    it('ends the provider’s stream when a caller without a key goes away', async () => {
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('keyless leaves', {
        kind: 'stream',
        events: completionEvents('not for anyone'),
        gate: (i) => (i === 0 ? held : Promise.resolve()),
      });
      const controller = new AbortController();
      const leaving = post(streamOf('keyless leaves'), {}).catch(() => undefined);
      void leaving;
      const request = fetch(`${apiUrl}/v1/chat/completions`, {
        method: 'POST',
        signal: controller.signal,
        headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json' },
        body: JSON.stringify({ ...streamOf('keyless leaves'), user: 'the one that leaves' }),
      }).catch(() => undefined);
      await until(() => provider.requests.filter((r) => r.userText === 'keyless leaves').length === 2);
      controller.abort();
      await request;
      await until(
        () => provider.requests.filter((r) => r.userText === 'keyless leaves').some((r) => r.closedEarly),
        'the provider call to be closed',
      );
      release();
    });

    it('ends an attached caller’s stream with the error event too when the provider’s breaks', async () => {
      const k = key();
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      const events = completionEvents('this stream will not make it to the end');
      replies.set('attached break', {
        kind: 'stream',
        events,
        breakAfter: 4,
        gate: (i) => (i === 3 ? held : Promise.resolve()),
      });
      const first = post(streamOf('attached break'), { 'idempotency-key': k }).then((r) => r.text());
      await until(() => provider.requests.some((r) => r.userText === 'attached break'));
      await recorded(k, events.slice(0, 3));
      // Its head came while the call is held: it is attached to the running call.
      const attached = await post(streamOf('attached break'), { 'idempotency-key': k });
      expect(attached.headers.get('idempotent-replayed')).toBe('true');
      release();
      const expected = events.slice(0, 4).join('') + BROKEN_STREAM_EVENT;
      expect(await first).toBe(expected);
      expect(await attached.text()).toBe(expected);
      expect(provider.requests.filter((r) => r.userText === 'attached break')).toHaveLength(1);
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
    });

    it('counts a stream’s tokens once, from its usage chunk, not for a replay or an attached duplicate', async () => {
      const prompt = () => metricValue(api.server, 'gateway_tokens_total', { tenant: TENANT_B.tenant, kind: 'prompt' });
      const before = await prompt();
      const k = key();
      replies.set('stream tokens', { kind: 'stream', events: completionEvents('a b c', { usage: true }) });
      await (await post(streamOf('stream tokens'), { 'idempotency-key': k }, TENANT_B)).text();
      await (await post(streamOf('stream tokens'), { 'idempotency-key': k }, TENANT_B)).text();
      expect((await prompt()) - before).toBe(11);
    });
  });

  describe('a provider that misbehaves', () => {
    const MiB = 1024 * 1024;
    const recordOf = (k: string) => redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`);
    /** A promise and its resolve, to order what the provider and the test do. */
    function signal(): { promise: Promise<void>; resolve: () => void } {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      return { promise, resolve };
    }
    /** This process's RSS (the api runs in it) at its highest while `sample` is called. */
    function rssPeak(): { sample: () => void; growth: () => number } {
      const base = process.memoryUsage.rss();
      let peak = base;
      return {
        sample: () => (peak = Math.max(peak, process.memoryUsage.rss())),
        growth: () => peak - base,
      };
    }
    /**
     * The event loop's worst delay is wall-clock, so it is not asserted; with
     * GATEWAY_MEASURE=1 it is printed with the RSS growth (docs/benchmarks.md).
     */
    function measured(
      what: string,
      loop: ReturnType<typeof monitorEventLoopDelay>,
      rss: { growth: () => number },
    ): void {
      loop.disable();
      if (process.env.GATEWAY_MEASURE === '1')
        process.stdout.write(
          `${what}: event loop max delay ${(loop.max / 1e6).toFixed(0)} ms, RSS +${(rss.growth() / MiB).toFixed(0)} MiB\n`,
        );
    }
    /** Reads a body as it comes, keeping only its size and its first and last bytes. */
    async function drain(res: globalThis.Response): Promise<{ bytes: number; head: string; tail: string }> {
      let bytes = 0;
      let head = '';
      let tail = '';
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        bytes += chunk.length;
        if (head.length < 256) head += Buffer.from(chunk.subarray(0, 256 - head.length)).toString('latin1');
        tail = (tail + Buffer.from(chunk.subarray(-512)).toString('latin1')).slice(-512);
      }
      return { bytes, head, tail };
    }

    it.each([
      ['without a key', undefined],
      ['with a key', 'key'],
    ])(
      'ends a stream whose one event passes 4 MiB as broken and lets the provider go, serving meanwhile (%s)',
      async (how, keyed) => {
        // Timeline: the provider sends `data: "` and then 30 MB of x, no line
        // break. 1 MiB in, it waits: /health/live is answered while that event is
        // open. Then it goes on, and past 4 MiB the gateway must cut it (before,
        // it read all 30 MB, each chunk copied with all the bytes before it).
        const reached = signal();
        const resume = signal();
        const rss = rssPeak();
        const loop = monitorEventLoopDelay({ resolution: 10 });
        loop.enable();
        const k = keyed === undefined ? undefined : key();
        const text = `one endless event ${k ?? 'keyless'}`;
        replies.set(text, {
          kind: 'huge',
          contentType: 'text/event-stream',
          bytes: 30 * 1000 * 1000,
          prefix: 'data: "',
          pause: { afterBytes: MiB, reached: reached.resolve, until: resume.promise },
          onWrite: rss.sample,
        });
        const answer = post({ ...ask(text), stream: true }, k === undefined ? {} : { 'idempotency-key': k });
        await reached.promise;
        const live = await fetch(`${apiUrl}/health/live`);
        expect(live.status).toBe(200);
        resume.resolve();
        const res = await answer;
        expect(res.status).toBe(200);
        expect(await res.text()).toBe(BROKEN_STREAM_EVENT);
        const [seen] = provider.requests.filter((r) => r.userText === text);
        await until(() => seen.closedEarly, 'the provider’s connection closed by the gateway');
        // Cut a little past the cap (what the sockets' buffers held), far from the 30 MB.
        expect(seen.bytesSent).toBeLessThan(12 * MiB);
        expect(rss.growth()).toBeLessThan(96 * MiB);
        // Nothing stored: the key is free for the retry.
        if (k !== undefined) await expect(recordOf(k)).resolves.toBe(0);
        measured(`one 30 MB event, ${how}`, loop, rss);
      },
    );

    it('answers 502 for a call the provider reset after receiving it, and never sends it twice', async () => {
      // Each on a kept-alive connection (a warm-up call first): the case that used to be resent.
      const cases = [
        { name: 'reset keyed', body: ask('reset keyed'), key: key() },
        { name: 'reset keyed stream', body: { ...ask('reset keyed stream'), stream: true }, key: key() },
        { name: 'reset keyless', body: ask('reset keyless'), key: undefined },
      ];
      for (const c of cases) {
        replies.set(c.name, { kind: 'reset' });
        await (await post(ask(`warm-up for ${c.name}`))).text();
        const res = await post(c.body, c.key === undefined ? {} : { 'idempotency-key': c.key });
        expect({ name: c.name, status: res.status }).toEqual({ name: c.name, status: 502 });
        expect(await res.json()).toMatchObject({
          error: {
            code: 'upstream_unreachable',
            type: 'server_error',
            message: expect.stringMatching(/not sent again/),
          },
        });
        const [warm] = provider.requests.filter((r) => r.userText === `warm-up for ${c.name}`);
        const calls = provider.requests.filter((r) => r.userText === c.name);
        expect({ name: c.name, calls: calls.length }).toEqual({ name: c.name, calls: 1 });
        expect(calls[0].connection).toBe(warm.connection);
        if (c.key !== undefined) await expect(recordOf(c.key)).resolves.toBe(0);
      }
    });

    it('relays four 50 MB answers at once at their callers’ pace, in bounded memory, storing none', async () => {
      const size = 50 * 1000 * 1000;
      const suffix =
        '"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1000,"total_tokens":1007}}';
      const prefix = (n: number) =>
        `{"id":"chatcmpl-huge-${n}","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`;
      const rss = rssPeak();
      const loop = monitorEventLoopDelay({ resolution: 10 });
      loop.enable();
      const tokens = () =>
        metricValue(api.server, 'gateway_tokens_total', { tenant: TENANT_A.tenant, kind: 'completion' });
      const tokensBefore = await tokens();
      const callers = [key(), key(), undefined, undefined].map((k, n) => {
        replies.set(`huge answer ${n}`, {
          kind: 'huge',
          contentType: 'application/json',
          bytes: size,
          prefix: prefix(n),
          suffix,
          onWrite: rss.sample,
        });
        return { k, n, res: post(ask(`huge answer ${n}`), k === undefined ? {} : { 'idempotency-key': k }) };
      });
      // Read as they come, all four at once, as four callers would.
      const answers = await Promise.all(
        callers.map(async ({ res }) => {
          const answer = await res;
          return { status: answer.status, type: answer.headers.get('content-type'), ...(await drain(answer)) };
        }),
      );
      for (const { k, n } of callers) {
        const { status, type, bytes, head, tail } = answers[n];
        expect({ n, status, type, bytes }).toEqual({ n, status: 200, type: 'application/json', bytes: size });
        expect(head.startsWith(prefix(n))).toBe(true);
        expect(tail.endsWith(suffix)).toBe(true);
        expect(provider.requests.filter((r) => r.userText === `huge answer ${n}`)).toHaveLength(1);
        // Too large to store: the key is free, its retry is a new call.
        if (k !== undefined) await expect(recordOf(k)).resolves.toBe(0);
      }
      // Before: the four were read whole, +800 MB.
      expect(rss.growth()).toBeLessThan(256 * MiB);
      await expect(tokens()).resolves.toBe(tokensBefore + 4 * 1000);
      measured('four 50 MB answers', loop, rss);
    });

    it.each([
      ['without a key', undefined],
      ['with a key', 'key'],
    ])('cuts the connection of a too-large whole answer the provider breaks off mid-body (%s)', async (how, keyed) => {
      // Before: the caller got a clean 200 whose JSON body ended with the
      // stream_broken SSE event, which looks like a complete answer.
      const size = 50 * 1000 * 1000;
      const k = keyed === undefined ? undefined : key();
      const text = `huge answer broken ${how} ${k ?? ''}`;
      replies.set(text, {
        kind: 'huge',
        contentType: 'application/json',
        bytes: size,
        prefix: '{"id":"chatcmpl-broken","object":"chat.completion","choices":[{"index":0,"message":{"content":"',
        breakAfterBytes: 8 * MiB,
      });
      const res = await post(ask(text), k === undefined ? {} : { 'idempotency-key': k });
      expect(res.status).toBe(200);
      let received = 0;
      let tail = '';
      const read = (async () => {
        for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
          received += chunk.length;
          tail = (tail + Buffer.from(chunk.subarray(-512)).toString('latin1')).slice(-512);
        }
      })();
      await expect(read).rejects.toThrow();
      expect(tail).not.toContain('stream_broken');
      expect(received).toBeLessThan(size);
      expect(provider.requests.filter((r) => r.userText === text)).toHaveLength(1);
      if (k !== undefined)
        await eventually(async () => ((await recordOf(k)) === 0 ? true : undefined), 5000, 'the key freed');
    });

    it('stops reading a too-large keyed answer whose caller went away: nothing is kept for a retry', async () => {
      const k = key();
      const text = `huge answer abandoned ${k}`;
      const size = 50 * 1000 * 1000;
      replies.set(text, {
        kind: 'huge',
        contentType: 'application/json',
        bytes: size,
        prefix: '{"id":"chatcmpl-abandoned","object":"chat.completion","choices":[{"index":0,"message":{"content":"',
      });
      const caller = new AbortController();
      const res = await post(ask(text), { 'idempotency-key': k }, TENANT_A, apiUrl, caller.signal);
      expect(res.status).toBe(200);
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      await reader.read();
      caller.abort();
      const [seen] = provider.requests.filter((r) => r.userText === text);
      await until(() => seen.closedEarly, 'the provider’s connection closed by the gateway');
      expect(seen.bytesSent).toBeLessThan(size);
      await eventually(async () => ((await recordOf(k)) === 0 ? true : undefined), 5000, 'the key freed');
    });

    it('holds the key of a too-large whole answer while it is relayed: a duplicate gets 409, no second call', async () => {
      // Timeline: a keyed 50 MB answer passes the 4 MiB cap, so it is relayed
      // as it arrives and cannot be stored; 8 MiB in, the provider waits. A
      // duplicate then must get 409 (before: the key was freed at the first
      // frame, so the duplicate called the provider again, or attached and got
      // a 200 holding the broken-stream event). Once the answer ends, the key is free.
      const size = 50 * 1000 * 1000;
      const reached = signal();
      const resume = signal();
      const k = key();
      const text = `huge answer held ${k}`;
      replies.set(text, {
        kind: 'huge',
        contentType: 'application/json',
        bytes: size,
        prefix: '{"id":"chatcmpl-held","object":"chat.completion","choices":[{"index":0,"message":{"content":"',
        suffix: '"}}]}',
        pause: { afterBytes: 8 * MiB, reached: reached.resolve, until: resume.promise },
      });
      const first = await post(ask(text), { 'idempotency-key': k });
      expect(first.status).toBe(200);
      const firstBody = drain(first);
      await reached.promise;
      const duplicate = await post(ask(text), { 'idempotency-key': k });
      expect(duplicate.status).toBe(409);
      expect(Number(duplicate.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      // The SDKs obey x-should-retry before their own rule by status.
      expect(duplicate.headers.get('x-should-retry')).toBe('true');
      expect(await duplicate.json()).toMatchObject({ error: { type: expect.any(String) } });
      expect(provider.requests.filter((r) => r.userText === text)).toHaveLength(1);
      await expect(recordOf(k)).resolves.toBe(1);
      resume.resolve();
      await expect(firstBody).resolves.toMatchObject({ bytes: size });
      await expect(recordOf(k)).resolves.toBe(0);
      expect(provider.requests.filter((r) => r.userText === text)).toHaveLength(1);
    });
  });

  describe('across api processes', () => {
    let other: AppProcess;
    beforeAll(async () => {
      other = await startAppProcess('api', freePort(61), {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key},${TENANT_B.tenant}:${TENANT_B.key}`,
        LOG_LEVEL: 'warn',
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'sk-upstream',
        OPENAI_BASE_URL: provider.baseUrl,
      });
    }, 60_000);
    afterAll(async () => {
      other.kill('SIGTERM');
      await other.exited;
    });

    it('attaches a duplicate that reaches another api process to the running stream', async () => {
      const k = key();
      const events = completionEvents('a retry on another pod reads the same stream', { usage: true });
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('other pod', { kind: 'stream', events, gate: (i) => (i === 2 ? held : Promise.resolve()) });
      const first = post(streamOf('other pod'), { 'idempotency-key': k }).then((r) => r.text());
      await until(() => provider.requests.some((r) => r.userText === 'other pod'));
      await recorded(k, events.slice(0, 2));
      const stream = await sdk(TENANT_A, other.url).chat.completions.create(streamOf('other pod'), {
        headers: { 'Idempotency-Key': k },
      });
      const chunks: string[] = [];
      const reading = (async () => {
        for await (const chunk of stream) chunks.push(JSON.stringify(chunk));
      })();
      // The events so far reach the attached caller before the live ones are let go.
      await until(() => chunks.length === 2, 'the two events recorded before the hold, read on the other process');
      release();
      await reading;
      expect(await first).toBe(events.join(''));
      expect(chunks.map((c) => `data: ${c}\n\n`)).toEqual(events.slice(0, -1));
      expect(provider.requests.filter((r) => r.userText === 'other pod')).toHaveLength(1);
    });

    function streamOf(text: string) {
      return { ...ask(text), stream: true as const, stream_options: { include_usage: true } };
    }
  });

  describe('an api stopping while a stream runs', () => {
    it('refuses new calls, gives the running one HTTP_REQUEST_TIMEOUT_S, then cuts it: stream_broken, key freed, exit 0', async () => {
      const stopping = await startAppProcess('api', freePort(63), {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key}`,
        // For the line its drain logs as it starts refusing new calls.
        LOG_LEVEL: 'info',
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'sk-upstream',
        OPENAI_BASE_URL: provider.baseUrl,
        HTTP_REQUEST_TIMEOUT_S: '1',
      });
      const k = key();
      const held = new Promise<void>(() => undefined); // never released: the provider stalls mid-stream
      replies.set('stopping pod', {
        kind: 'stream',
        events: completionEvents('cut short by a shutdown'),
        gate: (i) => (i === 2 ? held : Promise.resolve()),
      });
      const answer = await post(
        { ...ask('stopping pod'), stream: true },
        { 'idempotency-key': k },
        TENANT_A,
        stopping.url,
      );
      // The stream is under way (its first events reached the caller) before the SIGTERM, however slow the machine.
      const reader = answer.body!.getReader();
      const decoder = new TextDecoder();
      let text = decoder.decode((await reader.read()).value, { stream: true });
      const streamed = (async () => {
        for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read())
          text += decoder.decode(chunk.value, { stream: true });
        return text;
      })();
      stopping.kill('SIGTERM');
      // The gateway refuses new calls from when its drain begins, which it logs.
      await eventually(
        () =>
          stopping.lines.find(
            (l) => typeof l.msg === 'string' && /^waiting up to \d+ ms for 1 gateway call\(s\) to finish$/.test(l.msg),
          ),
        10_000,
        'the drain to begin',
      );
      const during = await post(
        ask('arrives while stopping'),
        { 'idempotency-key': key() },
        TENANT_A,
        stopping.url,
      ).catch(() => undefined);
      if (during) {
        expect(during.status).toBe(503);
        expect(await during.json()).toMatchObject({ error: { code: 'shutting_down' } });
      }
      expect((await streamed).endsWith(`${BROKEN_STREAM_EVENT}`)).toBe(true);
      await expect(stopping.exited).resolves.toEqual({ code: 0, signal: null });
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      expect(provider.requests.some((r) => r.userText === 'arrives while stopping')).toBe(false);
    }, 30_000);
  });

  describe('the gateway’s own errors, in OpenAI’s envelope', () => {
    it('401 for a missing or unknown key, as the SDK’s AuthenticationError', async () => {
      await expect(sdk({ key: 'not-a-key-0123456789' }).chat.completions.create(ask('who am i'))).rejects.toMatchObject(
        {
          status: 401,
          code: 'invalid_api_key',
        },
      );
      const res = await fetch(`${apiUrl}/v1/chat/completions`, {
        method: 'POST',
        body: '{}',
        headers: { 'content-type': 'application/json' },
      });
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(await res.json()).toMatchObject({ error: { type: 'authentication_error', code: 'invalid_api_key' } });
      expect(provider.requests.some((r) => r.userText === 'who am i')).toBe(false);
    });

    it('400 for a body it cannot relay, with no upstream call and no record', async () => {
      const k = key();
      for (const body of [
        { model: 'gpt-test' },
        { model: 'gpt-test', messages: [] },
        { ...ask('bad stream'), stream: 'yes' },
        [1, 2],
        '{"model":',
      ]) {
        const res = await post(body, { 'idempotency-key': k });
        expect(res.status).toBe(400);
        expect(await res.json()).toMatchObject({ error: { type: 'invalid_request_error' } });
      }
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      expect(provider.requests.some((r) => r.userText === 'bad stream')).toBe(false);
    });

    it('400 for a body that gives a member name twice, with no upstream call and no record', async () => {
      // JSON.parse keeps the last "model", a provider's parser may keep the first.
      const k = key();
      const res = await post(
        '{"model":"gpt-test","messages":[{"role":"user","content":"twice named"}],"model":"gpt-expensive"}',
        { 'idempotency-key': k },
      );
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({
        error: {
          type: 'invalid_request_error',
          code: 'json_duplicate_name',
          message: expect.stringMatching(/"model"/),
        },
      });
      await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      expect(provider.requests.some((r) => r.userText === 'twice named')).toBe(false);
    });

    it('422 for a key reused with a number the provider reads otherwise, though JavaScript reads it the same', async () => {
      const k = key();
      const body = (seed: string, temperature: string) =>
        `{"model":"gpt-test","messages":[{"role":"user","content":"big seed"}],"seed":${seed},"temperature":${temperature}}`;
      const first = await post(body('9007199254740993', '1'), { 'idempotency-key': k });
      expect(first.status).toBe(200);
      // Past 2^53 both are the same double; a provider parsing integers exactly reads two seeds.
      const bigger = await post(body('9007199254740992', '1'), { 'idempotency-key': k });
      expect(bigger.status).toBe(422);
      expect(await bigger.json()).toMatchObject({ error: { code: 'idempotency_key_reused' } });
      // 1.0 is a float to Python, 1 an int: written otherwise, another body.
      const float = await post(body('9007199254740993', '1.0'), { 'idempotency-key': k });
      expect(float.status).toBe(422);
      // The same bytes in another key order and spacing are the same body.
      const same = await post(
        '{ "temperature": 1, "seed": 9007199254740993, "messages": [{"content":"big seed","role":"user"}], "model": "gpt-test" }',
        { 'idempotency-key': k },
      );
      expect(same.status).toBe(200);
      expect(same.headers.get('idempotent-replayed')).toBe('true');
      expect(provider.requests.filter((r) => r.userText === 'big seed')).toHaveLength(1);
    });

    it('replays a record stored before fingerprints were versioned, for a body that writes 1.0', async () => {
      // A record of the version before: its fingerprint is the bare SHA-256 of
      // the parsed body (1.0 read as 1). The same body retried against it, as a
      // Python client's would be during a rollout, must replay it, not get 422.
      const k = key();
      const text = `legacy record ${k}`;
      const body = (temperature: string) =>
        `{"model":"gpt-test","messages":[{"role":"user","content":"${text}"}],"temperature":${temperature}}`;
      const operation = `${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`;
      const store = new RedisIdempotencyStore(redis);
      const legacy = legacyFingerprint(JSON.parse(body('1.0')));
      const stored = '{"id":"chatcmpl-before-the-upgrade","object":"chat.completion","choices":[]}';
      await store.claim(operation, 'the-version-before', legacy, 10_000);
      await expect(
        store.complete(
          operation,
          'the-version-before',
          legacy,
          { status: 200, headers: { 'content-type': 'application/json' }, body: Buffer.from(stored) },
          60_000,
        ),
      ).resolves.toBe(true);
      const replay = await post(body('1.0'), { 'idempotency-key': k });
      expect(replay.status).toBe(200);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(await replay.text()).toBe(stored);
      // Another body is still another body against an old record.
      const other = await post(body('0.5'), { 'idempotency-key': k });
      expect(other.status).toBe(422);
      expect(provider.requests.filter((r) => r.userText === text)).toHaveLength(0);
    });

    it('400 for a malformed Idempotency-Key', async () => {
      const res = await post(ask('bad key'), { 'idempotency-key': 'short' });
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: 'idempotency_key_invalid' } });
    });

    it('502 when the provider is unreachable, nothing stored', async () => {
      const dead = await startApi({
        env: { LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'sk', OPENAI_BASE_URL: `http://127.0.0.1:${freePort(62)}/v1` },
      });
      try {
        await dead.app.listen(0, '127.0.0.1');
        const url = `http://127.0.0.1:${(dead.server.address() as AddressInfo).port}`;
        const k = key();
        await expect(
          sdk(TENANT_A, url).chat.completions.create(ask('nobody home'), { headers: { 'Idempotency-Key': k } }),
        ).rejects.toMatchObject({
          status: 502,
          code: 'upstream_unreachable',
        });
        await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
      } finally {
        await dead.close();
      }
    });

    it('504 after GATEWAY_TIMEOUT_S, nothing stored', async () => {
      replies.set('never answers', { kind: 'hang' });
      const slow = await startApi({
        env: {
          LLM_PROVIDER: 'openai',
          OPENAI_API_KEY: 'sk',
          OPENAI_BASE_URL: provider.baseUrl,
          GATEWAY_TIMEOUT_S: '1',
        },
      });
      try {
        await slow.app.listen(0, '127.0.0.1');
        const url = `http://127.0.0.1:${(slow.server.address() as AddressInfo).port}`;
        const k = key();
        await expect(
          sdk(TENANT_A, url).chat.completions.create(ask('never answers'), { headers: { 'Idempotency-Key': k } }),
        ).rejects.toMatchObject({
          status: 504,
          code: 'upstream_timeout',
        });
        await expect(redis.exists(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${k}`)).resolves.toBe(0);
        // Out of time in the middle of a large answer: counted as a timeout, not as a broken stream.
        const outcome = (o: string) => metricValue(slow.server, 'gateway_calls_total', { outcome: o });
        let resume!: () => void;
        const stalled = new Promise<void>((r) => (resume = r));
        replies.set('stalls mid-answer', {
          kind: 'huge',
          contentType: 'application/json',
          bytes: 50 * 1000 * 1000,
          pause: { afterBytes: 8 * 1024 * 1024, reached: () => undefined, until: stalled },
        });
        const large = await post(ask('stalls mid-answer'), { 'idempotency-key': key() }, TENANT_A, url);
        expect(large.status).toBe(200);
        await expect(large.arrayBuffer()).rejects.toThrow();
        resume();
        await expect(outcome('upstream_timeout')).resolves.toBe(2);
        await expect(outcome('broken_stream')).resolves.toBe(0);
      } finally {
        await slow.close();
      }
    });
  });

  it('is documented in OpenAPI: the optional key, both answer types, errors in OpenAI’s envelope', async () => {
    const doc = (await (await fetch(`${apiUrl}/docs/openapi.json`)).json()) as {
      paths: Record<
        string,
        {
          post: {
            parameters?: { name: string; required?: boolean }[];
            responses: Record<string, { content?: Record<string, unknown> }>;
          };
        }
      >;
    };
    const op = doc.paths['/v1/chat/completions'].post;
    expect(op.parameters?.find((p) => p.name === 'Idempotency-Key')?.required).toBe(false);
    expect(Object.keys(op.responses['200'].content ?? {})).toEqual(['application/json', 'text/event-stream']);
    for (const status of ['400', '401', '409', '422', '502', '504']) {
      expect({ status, types: Object.keys(op.responses[status]?.content ?? {}) }).toEqual({
        status,
        types: ['application/json'],
      });
    }
  });

  describe('the built-in model (LLM_PROVIDER=fake)', () => {
    it('answers the SDK offline, streaming included, and replays by key', async () => {
      const fake = await startApi({ env: { LLM_PROVIDER: 'fake' } });
      try {
        await fake.app.listen(0, '127.0.0.1');
        const url = `http://127.0.0.1:${(fake.server.address() as AddressInfo).port}`;
        const { data: completion, response } = await sdk(TENANT_A, url)
          .chat.completions.create(ask('hello offline'))
          .withResponse();
        expect(completion.choices[0].message.content).toContain('hello offline');
        // X-Request-Id is ours on every answer; the provider's own id is kept beside it.
        expect(response.headers.get('x-upstream-request-id')).toMatch(/^req_/);
        expect(response.headers.get('x-request-id')).not.toBe(response.headers.get('x-upstream-request-id'));
        const k = key();
        const body = { ...ask('stream offline'), stream: true as const };
        const stream = await sdk(TENANT_A, url).chat.completions.create(body, { headers: { 'Idempotency-Key': k } });
        let text = '';
        for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
        expect(text).toContain('stream offline');
        const replay = await post(body, { 'idempotency-key': k }, TENANT_A, url);
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(await replay.text()).toMatch(/data: \[DONE\]\n\n$/);
      } finally {
        await fake.close();
      }
    });
  });
});
