import OpenAI from 'openai';
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { responseEvents } from '@app/llm';
import { bearer, type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { completionEvents, FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { freshRedis } from '../support/infra';
import { metricValue } from '../support/metrics';

/** A port of 127.0.0.1 that nothing listens on: a connection there is refused. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

/** A fake provider whose answer per user text a test sets; any other text gets `<name>: <text>`. */
async function fakeProvider(name: string) {
  const replies = new Map<string, ModelReply | (() => ModelReply)>();
  const server = await new FakeOpenAiServer((_n, text) => {
    const reply = replies.get(text);
    if (reply === undefined) return { kind: 'complete', content: `${name}: ${text}` };
    return typeof reply === 'function' ? reply() : reply;
  }).start();
  return { server, replies, calls: (text: string) => server.requests.filter((r) => r.userText === text) };
}

/**
 * GATEWAY_UPSTREAMS: a request goes to the first upstream that lists its
 * model, and to the next only when the failure proves nothing was made; a
 * call whose outcome is unknown never falls back, and its retry goes to the
 * same upstream with the same upstream key. Two local fake providers and a
 * port that refuses; each case asserts which upstream was called, how often,
 * with which key, and what the caller saw (X-Gateway-Upstream included). On
 * both stores of the upstream pins.
 */
describe.each(['redis', 'postgres'] as const)('the gateway with several upstreams (IDEMPOTENCY_STORE=%s)', (store) => {
  let primary: Awaited<ReturnType<typeof fakeProvider>>;
  let secondary: Awaited<ReturnType<typeof fakeProvider>>;
  let api: ApiHarness;
  let apiUrl: string;
  const key = () => `up-${randomUUID()}`;
  const chat = (model: string, text: string) => ({ model, messages: [{ role: 'user', content: text }] });
  const upstreamCalls = (upstream: string, outcome: string) =>
    metricValue(api.server, 'gateway_upstream_calls_total', { upstream, outcome });
  const fellBack = (upstream: string) => upstreamCalls(upstream, 'fell_back');

  function post(body: object, headers: Record<string, string> = {}, path = 'chat/completions') {
    return fetch(`${apiUrl}/v1/${path}`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
  }

  beforeAll(async () => {
    (await freshRedis()).disconnect();
    primary = await fakeProvider('primary');
    secondary = await fakeProvider('secondary');
    const refused = `http://127.0.0.1:${await closedPort()}/v1`;
    api = await startApi({
      env: {
        IDEMPOTENCY_STORE: store,
        GATEWAY_TIMEOUT_S: '2',
        PRIMARY_KEY: 'sk-primary',
        SECONDARY_KEY: 'sk-secondary',
        GATEWAY_UPSTREAMS: JSON.stringify([
          { name: 'refusing', base_url: refused, api_key_env: 'PRIMARY_KEY', models: ['fallback-*'] },
          { name: 'primary', base_url: primary.server.baseUrl, api_key_env: 'PRIMARY_KEY', models: ['gpt-*'] },
          {
            name: 'secondary',
            base_url: secondary.server.baseUrl,
            api_key_env: 'SECONDARY_KEY',
            models: ['gpt-*', 'claude-*', 'fallback-*'],
          },
        ]),
      },
    });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await api.close();
    await primary.server.stop();
    await secondary.server.stop();
  });

  describe('routing by model', () => {
    it('sends a model to the first upstream that lists it, with its own key, and names it on the answer and the replay', async () => {
      const k = key();
      const answered = await upstreamCalls('primary', 'answered');
      const first = await post(chat('gpt-test', 'route gpt'), { 'idempotency-key': k });
      expect(await first.json()).toMatchObject({ choices: [{ message: { content: 'primary: route gpt' } }] });
      expect(first.headers.get('x-gateway-upstream')).toBe('primary');
      expect(primary.calls('route gpt')[0].headers.authorization).toBe('Bearer sk-primary');
      const replay = await post(chat('gpt-test', 'route gpt'), { 'idempotency-key': k });
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.headers.get('x-gateway-upstream')).toBe('primary');
      // The replay made no upstream call: one answered call counted.
      expect((await upstreamCalls('primary', 'answered')) - answered).toBe(1);
      const other = await new OpenAI({ apiKey: TENANT_A.key, baseURL: `${apiUrl}/v1`, maxRetries: 0 }).responses
        .create({ model: 'claude-test', input: 'route claude' })
        .withResponse();
      expect(other.data.output_text).toBe('secondary: route claude');
      expect(other.response.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(primary.calls('route gpt')).toHaveLength(1);
      expect(primary.calls('route claude')).toHaveLength(0);
      expect(secondary.calls('route claude')[0].headers.authorization).toBe('Bearer sk-secondary');
    });

    it.each(['chat/completions', 'responses'])(
      'answers a model no upstream lists with 404 model_not_found on %s, nothing upstream',
      async (path) => {
        const text = `no such model ${path}`;
        const body = path === 'responses' ? { model: 'llama-3', input: text } : chat('llama-3', text);
        const res = await post(body, { 'idempotency-key': key() }, path);
        expect(res.status).toBe(404);
        expect(await res.json()).toMatchObject({ error: { code: 'model_not_found', param: 'model' } });
        expect(primary.calls(text)).toHaveLength(0);
        expect(secondary.calls(text)).toHaveLength(0);
      },
    );
  });

  describe('a response’s own routes go to the upstream that made it', () => {
    it('previous_response_id continues on that upstream, whatever the model; GET and cancel are forwarded there', async () => {
      const client = new OpenAI({ apiKey: TENANT_A.key, baseURL: `${apiUrl}/v1`, maxRetries: 0 });
      const first = await client.responses.create({ model: 'claude-test', input: 'started on secondary' });
      const next = await client.responses
        .create({ model: 'gpt-test', input: 'continued', previous_response_id: first.id })
        .withResponse();
      expect(next.response.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(secondary.calls('continued')).toHaveLength(1);
      expect(primary.calls('continued')).toHaveLength(0);
      const cancel = await fetch(`${apiUrl}/v1/responses/${first.id}/cancel`, {
        method: 'POST',
        headers: { authorization: bearer(TENANT_A) },
      });
      expect(cancel.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(secondary.server.responseRouteCalls).toContain(`POST responses/${first.id}/cancel`);
      expect(primary.server.responseRouteCalls).toHaveLength(0);
    });
  });

  describe('fallback: only when the failure proves nothing was made', () => {
    it.each([429, 500, 502, 503, 529])(
      'a %i from the first upstream: the next one answers, with the same upstream key; the replay names it',
      async (status) => {
        const text = `fall back on ${status}`;
        primary.replies.set(text, { kind: 'error', status, headers: { 'retry-after': '1' } });
        const before = await fellBack('primary');
        const k = key();
        const res = await post(chat('gpt-test', text), { 'idempotency-key': k });
        expect(res.status).toBe(200);
        expect(res.headers.get('x-gateway-upstream')).toBe('secondary');
        expect(await res.json()).toMatchObject({ choices: [{ message: { content: `secondary: ${text}` } }] });
        const [a] = primary.calls(text);
        const [b] = secondary.calls(text);
        expect(b.headers['idempotency-key']).toBe(a.headers['idempotency-key']);
        expect((await fellBack('primary')) - before).toBe(1);
        const replay = await post(chat('gpt-test', text), { 'idempotency-key': k });
        expect(replay.headers.get('x-gateway-upstream')).toBe('secondary');
        expect(primary.calls(text)).toHaveLength(1);
        expect(secondary.calls(text)).toHaveLength(1);
      },
    );

    it('a refused connection: the next upstream answers', async () => {
      const res = await post(chat('fallback-model', 'refused first'), { 'idempotency-key': key() });
      expect(res.status).toBe(200);
      expect(res.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(secondary.calls('refused first')).toHaveLength(1);
      await expect(fellBack('refusing')).resolves.toBeGreaterThan(0);
    });

    it('on /v1/responses too: a 503 falls back with the same upstream key; the replay and the response’s own routes name the upstream that made it', async () => {
      const text = 'responses fall back';
      primary.replies.set(text, { kind: 'error', status: 503 });
      const k = key();
      const res = await post({ model: 'gpt-test', input: text }, { 'idempotency-key': k }, 'responses');
      expect(res.status).toBe(200);
      expect(res.headers.get('x-gateway-upstream')).toBe('secondary');
      const made = (await res.json()) as { id: string; output: { content: { text: string }[] }[] };
      expect(made.output[0].content[0].text).toBe(`secondary: ${text}`);
      const [a] = primary.calls(text);
      const [b] = secondary.calls(text);
      expect(b.headers['idempotency-key']).toBe(a.headers['idempotency-key']);
      const replay = await post({ model: 'gpt-test', input: text }, { 'idempotency-key': k }, 'responses');
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.headers.get('x-gateway-upstream')).toBe('secondary');
      const cancel = await fetch(`${apiUrl}/v1/responses/${made.id}/cancel`, {
        method: 'POST',
        headers: { authorization: bearer(TENANT_A) },
      });
      expect(cancel.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(secondary.server.responseRouteCalls).toContain(`POST responses/${made.id}/cancel`);
      expect(primary.calls(text)).toHaveLength(1);
      expect(secondary.calls(text)).toHaveLength(1);
    });

    it('a 429 before a stream’s first byte falls back; the stream, its replay and a duplicate attached to it name the upstream', async () => {
      const text = 'responses stream falls back';
      primary.replies.set(text, { kind: 'error', status: 429, headers: { 'retry-after': '1' } });
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      const events = responseEvents({ pieces: ['Made', ' by', ' secondary.'], inputTokens: 3, model: 'gpt-test' });
      // Held after its first event until a duplicate has attached to it.
      secondary.replies.set(text, { kind: 'stream', events, gate: (i) => (i === 1 ? released : Promise.resolve()) });
      const k = key();
      const body = { model: 'gpt-test', input: text, stream: true };
      let attached: Response;
      let firstText: Promise<string>;
      try {
        const first = await post(body, { 'idempotency-key': k }, 'responses');
        expect(first.headers.get('x-gateway-upstream')).toBe('secondary');
        // Read on while the duplicate attaches.
        firstText = first.text();
        attached = await post(body, { 'idempotency-key': k }, 'responses');
        expect(attached.headers.get('idempotent-replayed')).toBe('true');
        expect(attached.headers.get('x-gateway-upstream')).toBe('secondary');
      } finally {
        // Never left held (GATEWAY_TIMEOUT_S would cut it), whatever failed above.
        release();
      }
      const whole = events.join('');
      expect(await firstText).toBe(whole);
      expect(await attached.text()).toBe(whole);
      const replay = await post(body, { 'idempotency-key': k }, 'responses');
      expect(replay.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(await replay.text()).toBe(whole);
      expect(primary.calls(text)).toHaveLength(1);
      expect(secondary.calls(text)).toHaveLength(1);
    });

    it('the last upstream’s failure is passed through as it is', async () => {
      const text = 'both overloaded';
      primary.replies.set(text, { kind: 'error', status: 503 });
      secondary.replies.set(text, { kind: 'error', status: 503, headers: { 'retry-after': '9' } });
      const res = await post(chat('gpt-test', text));
      expect(res.status).toBe(503);
      expect(res.headers.get('retry-after')).toBe('9');
      expect(res.headers.get('x-gateway-upstream')).toBe('secondary');
      expect(primary.calls(text)).toHaveLength(1);
      expect(secondary.calls(text)).toHaveLength(1);
    });

    it('a 400 is the request’s fault: passed through, no fallback', async () => {
      const text = 'a bad request';
      primary.replies.set(text, { kind: 'error', status: 400 });
      const before = await upstreamCalls('primary', 'error_status');
      const res = await post(chat('gpt-test', text), { 'idempotency-key': key() });
      expect(res.status).toBe(400);
      expect(res.headers.get('x-gateway-upstream')).toBe('primary');
      expect(secondary.calls(text)).toHaveLength(0);
      expect((await upstreamCalls('primary', 'error_status')) - before).toBe(1);
    });
  });

  describe('an unknown outcome: no fallback, and the retry stays on the same upstream with the same key', () => {
    const unknownOutcomes: [string, ModelReply, number, string][] = [
      ['a timeout', { kind: 'hang' }, 504, 'timeout'],
      ['a connection lost after the request was sent', { kind: 'reset' }, 502, 'unreachable'],
    ];
    it.each(unknownOutcomes)('%s', async (_, failure, status, outcome) => {
      const counted = await upstreamCalls('primary', outcome);
      const text = `unknown outcome: ${status}`;
      let n = 0;
      // First the unknown outcome; then an overload, which would fall back for a new call but not for this one.
      primary.replies.set(text, () =>
        ++n === 1 ? failure : n === 2 ? { kind: 'error', status: 503 } : { kind: 'complete', content: 'made once' },
      );
      const k = key();
      const first = await post(chat('gpt-test', text), { 'idempotency-key': k });
      expect(first.status).toBe(status);
      expect(first.headers.get('x-gateway-upstream')).toBe('primary');
      expect((await upstreamCalls('primary', outcome)) - counted).toBe(1);
      const retry = await post(chat('gpt-test', text), { 'idempotency-key': k });
      expect(retry.status).toBe(503);
      expect(retry.headers.get('x-gateway-upstream')).toBe('primary');
      const third = await post(chat('gpt-test', text), { 'idempotency-key': k });
      expect(await third.json()).toMatchObject({ choices: [{ message: { content: 'made once' } }] });
      expect(secondary.calls(text)).toHaveLength(0);
      const keys = primary.calls(text).map((r) => r.headers['idempotency-key']);
      expect(keys).toHaveLength(3);
      expect(new Set(keys).size).toBe(1);
    });

    it('without a key too: a timeout does not fall back', async () => {
      primary.replies.set('keyless hang', { kind: 'hang' });
      const res = await post(chat('gpt-test', 'keyless hang'));
      expect(res.status).toBe(504);
      expect(secondary.calls('keyless hang')).toHaveLength(0);
    });

    it('a stream cut after its first events: the error event, no fallback; its retry stays on that upstream with the same key', async () => {
      const text = 'cut stream';
      let n = 0;
      // Cut; then an overload, which would fall back for a new call but not for this one; then whole.
      primary.replies.set(text, () =>
        ++n === 1
          ? { kind: 'stream', events: completionEvents('never finished here'), breakAfter: 2 }
          : n === 2
            ? { kind: 'error', status: 503 }
            : { kind: 'stream', events: completionEvents('finished on the third call') },
      );
      const k = key();
      const body = { ...chat('gpt-test', text), stream: true };
      const res = await post(body, { 'idempotency-key': k });
      expect(res.status).toBe(200);
      expect(res.headers.get('x-gateway-upstream')).toBe('primary');
      expect(await res.text()).toMatch(/stream_broken/);
      const retry = await post(body, { 'idempotency-key': k });
      expect(retry.status).toBe(503);
      expect(retry.headers.get('x-gateway-upstream')).toBe('primary');
      const third = await post(body, { 'idempotency-key': k });
      expect(await third.text()).toBe(completionEvents('finished on the third call').join(''));
      expect(secondary.calls(text)).toHaveLength(0);
      const keys = primary.calls(text).map((r) => r.headers['idempotency-key']);
      expect(keys).toHaveLength(3);
      expect(new Set(keys).size).toBe(1);
    });
  });
});
