import OpenAI, { APIError } from 'openai';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { responseEvents } from '@app/llm';
import { RESPONSES_BROKEN_STREAM_EVENT } from '../../apps/api/src/gateway/openai-errors';
import { bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import type { FakeOpenAiServer, ModelReply } from '../support/fake-openai-server';
import { type GatewayHarness, type GatewayReply, startGateway } from '../support/gateway-harness';
import { eventually } from '../support/infra';
import { metricValue } from '../support/metrics';

/** A promise and the function that settles it: events of a test ordered by signals, not sleeps. */
function signal(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * A stream reply held before its event `at`: `reached` resolves when the provider has sent the events before
 * it, and the rest follow once `release()` is called.
 */
function heldStream(events: string[], at: number): { reply: ModelReply; reached: Promise<void>; release: () => void } {
  const reached = signal();
  const held = signal();
  return {
    reply: {
      kind: 'stream',
      events,
      gate: (i) => {
        if (i !== at) return Promise.resolve();
        reached.resolve();
        return held.promise;
      },
    },
    reached: reached.promise,
    release: held.resolve,
  };
}

/**
 * Reads an answer's body until `marker` has arrived (the caller has that much of a stream), and gives
 * the whole body's text once it ends: a test resumes a stream only after its caller saw its start.
 */
async function readUntil(res: globalThis.Response, marker: string): Promise<{ rest: Promise<string> }> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes(marker)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended before ${marker}`);
    text += decoder.decode(value, { stream: true });
  }
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return text + decoder.decode();
      text += decoder.decode(value, { stream: true });
    }
  })();
  return { rest };
}

/** The data of one event of a stream, parsed. */
const dataOf = (event: string): Record<string, unknown> =>
  JSON.parse(/^data: (.*)$/m.exec(event)![1]) as Record<string, unknown>;
/** The response a stream's events make (its response.created names it). */
const idOf = (events: readonly string[]): string => (dataOf(events[0]).response as { id: string }).id;
/** An event's sequence_number. */
const seqOf = (event: string): number => dataOf(event).sequence_number as number;

/** A stream's events for `text`, one delta per word, as OpenAI writes them. */
const eventsOf = (text: string, options: { incomplete?: boolean } = {}): string[] =>
  responseEvents(
    {
      pieces: text.match(/\s*\S+/g) ?? [],
      inputTokens: 3,
      model: 'gpt-test',
      ...(options.incomplete ? { incompleteReason: 'max_output_tokens' as const } : {}),
    },
    `resp_${randomUUID().replaceAll('-', '')}`,
  );

/**
 * POST /v1/responses with the official `openai` SDK (`responses.create`,
 * `responses.stream`) pointed at the api, and a local HTTP server playing the
 * provider's Responses API, streams included. Effects asserted: upstream
 * calls, the bytes each caller saw, records in Redis, token counters.
 */
describe('the gateway: POST /v1/responses', () => {
  let gateway: GatewayHarness;
  let provider: FakeOpenAiServer;
  let apiUrl: string;
  let redis: Redis;
  let replies: Map<string, GatewayReply>;
  const key = () => `gr-${randomUUID()}`;
  const sdk = (tenant: { key: string } = TENANT_A) =>
    new OpenAI({ apiKey: tenant.key, baseURL: `${apiUrl}/v1`, maxRetries: 0 });
  const ask = (text: string) => ({ model: 'gpt-test', input: text });
  const streamOf = (text: string) => ({ ...ask(text), stream: true as const });
  const upstream = (text: string) => provider.requests.filter((r) => r.userText === text);
  const recordKey = (k: string, tenant = TENANT_A.tenant) => `idem:${tenant}:POST:/v1/responses:${k}`;

  function post(body: unknown, headers: Record<string, string> = {}, tenant: { key: string } = TENANT_A) {
    return fetch(`${apiUrl}/v1/responses`, {
      method: 'POST',
      headers: { authorization: bearer(tenant), 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  }

  beforeAll(async () => {
    gateway = await startGateway();
    ({ provider, apiUrl, redis, replies } = gateway);
  });
  afterAll(() => gateway.close());

  describe('without streaming', () => {
    it('answers through responses.create and replays the stored bytes, with one upstream call carrying its own key', async () => {
      const k = key();
      const first = await sdk()
        .responses.create(ask('a whole response'), { headers: { 'Idempotency-Key': k } })
        .withResponse();
      expect(first.data.output_text).toBe('Echo: a whole response');
      expect(first.data.status).toBe('completed');
      const again = await post(ask('a whole response'), { 'idempotency-key': k });
      expect(again.status).toBe(200);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      // The SDK adds output_text to what it parsed; the rest is the wire's.
      const { output_text: _text, ...wire } = first.data;
      expect(JSON.parse(await again.text())).toEqual(wire);
      const calls = upstream('a whole response');
      expect(calls).toHaveLength(1);
      expect(calls[0].api).toBe('responses');
      // The provider's key for the operation: present, and never the caller's raw key.
      expect(calls[0].headers['idempotency-key']).toMatch(/^[0-9a-f-]{36}$/);
      expect(calls[0].headers['idempotency-key']).not.toBe(k);
      await expect(redis.exists(recordKey(k))).resolves.toBe(1);
    });

    it('counts a response’s input and output tokens once, not for its replay', async () => {
      const tokens = (kind: string) =>
        metricValue(gateway.api.server, 'gateway_tokens_total', { tenant: TENANT_B.tenant, kind });
      const [prompt, completion] = [await tokens('prompt'), await tokens('completion')];
      const k = key();
      await post(ask('count a response'), { 'idempotency-key': k }, TENANT_B);
      await post(ask('count a response'), { 'idempotency-key': k }, TENANT_B);
      // The fake provider's response: 7 input tokens, and one output token a word of "Echo: count a response".
      expect((await tokens('prompt')) - prompt).toBe(7);
      expect((await tokens('completion')) - completion).toBe(4);
      expect(upstream('count a response')).toHaveLength(1);
    });

    it('answers 422 for the same key with another body, and keys of chat completions are another route’s', async () => {
      const k = key();
      await sdk().responses.create(ask('reuse a key'), { headers: { 'Idempotency-Key': k } });
      const changed = await post({ ...ask('reuse a key'), temperature: 1 }, { 'idempotency-key': k });
      expect(changed.status).toBe(422);
      expect(changed.headers.get('x-should-retry')).toBe('false');
      expect(await changed.json()).toMatchObject({ error: { code: 'idempotency_key_reused' } });
      // The same key on chat completions is an operation of its own there.
      const chat = await sdk().chat.completions.create(
        { model: 'gpt-test', messages: [{ role: 'user', content: 'reuse a key' }] },
        { headers: { 'Idempotency-Key': k } },
      );
      expect(chat.choices[0].message.content).toBe('Echo: reuse a key');
      expect(upstream('reuse a key').map((r) => r.api)).toEqual(['responses', 'chat/completions']);
    });

    it('keeps tenants apart: one key, two tenants, two operations', async () => {
      const k = key();
      await post(ask('two tenants one key'), { 'idempotency-key': k }, TENANT_A);
      const b = await post(ask('two tenants one key'), { 'idempotency-key': k }, TENANT_B);
      expect(b.headers.get('idempotent-replayed')).toBeNull();
      const calls = upstream('two tenants one key');
      expect(calls).toHaveLength(2);
      expect(calls[0].headers['idempotency-key']).not.toBe(calls[1].headers['idempotency-key']);
    });

    it('passes a provider 429 through with its Retry-After, stores nothing, and lets the retry run', async () => {
      const k = key();
      let n = 0;
      replies.set('limited response', () =>
        ++n === 1
          ? { kind: 'error', status: 429, headers: { 'retry-after': '3' } }
          : { kind: 'complete', content: 'now it fits' },
      );
      const limited = await post(ask('limited response'), { 'idempotency-key': k });
      expect(limited.status).toBe(429);
      expect(limited.headers.get('retry-after')).toBe('3');
      await expect(redis.exists(recordKey(k))).resolves.toBe(0);
      const retried = await sdk().responses.create(ask('limited response'), { headers: { 'Idempotency-Key': k } });
      expect(retried.output_text).toBe('now it fits');
      expect(upstream('limited response')).toHaveLength(2);
    });
  });

  describe('an upstream 2xx that is not what the API promises', () => {
    it.each([
      ['an HTML page', 'text/html', '<html><body>Gateway Timeout</body></html>'],
      ['an empty JSON body', 'application/json', ''],
      ['JSON that is no object', 'application/json', '["resp"]'],
    ])(
      '%s: 502 upstream_malformed in the envelope, nothing stored, the retry goes upstream',
      async (what, type, body) => {
        const text = `malformed whole: ${what}`;
        let n = 0;
        replies.set(text, () =>
          ++n === 1
            ? { kind: 'raw', status: 200, headers: { 'content-type': type }, body }
            : { kind: 'complete', content: 'fine now' },
        );
        const k = key();
        const first = await post(ask(text), { 'idempotency-key': k });
        expect(first.status).toBe(502);
        expect(await first.json()).toMatchObject({ error: { code: 'upstream_malformed', type: 'server_error' } });
        await expect(redis.exists(recordKey(k))).resolves.toBe(0);
        const retry = await sdk().responses.create(ask(text), { headers: { 'Idempotency-Key': k } });
        expect(retry.output_text).toBe('fine now');
        expect(upstream(text)).toHaveLength(2);
      },
    );
  });

  describe('streaming', () => {
    it('relays a stream event for event, event: and data: lines alike, and replays the same bytes', async () => {
      const k = key();
      const events = eventsOf('Responses stream as events.');
      replies.set('stream a response', { kind: 'stream', events });
      const first = await post(streamOf('stream a response'), { 'idempotency-key': k });
      expect(first.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
      expect(await first.text()).toBe(events.join(''));
      // The SDK reads the replay as a stream of its own.
      const stream = sdk().responses.stream(ask('stream a response'), { headers: { 'Idempotency-Key': k } });
      const deltas: string[] = [];
      stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
      const final = await stream.finalResponse();
      expect(deltas.join('')).toBe('Responses stream as events.');
      expect(final.output_text).toBe('Responses stream as events.');
      const raw = await post(streamOf('stream a response'), { 'idempotency-key': k });
      expect(raw.headers.get('idempotent-replayed')).toBe('true');
      expect(await raw.text()).toBe(events.join(''));
      expect(upstream('stream a response')).toHaveLength(1);
    });

    it('stores a stream that ends in response.incomplete', async () => {
      const k = key();
      const events = eventsOf('cut short by the limit', { incomplete: true });
      replies.set('incomplete response', { kind: 'stream', events });
      expect(await (await post(streamOf('incomplete response'), { 'idempotency-key': k })).text()).toBe(
        events.join(''),
      );
      const replay = await post(streamOf('incomplete response'), { 'idempotency-key': k });
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(upstream('incomplete response')).toHaveLength(1);
    });

    it.each([
      [
        'ends with response.failed',
        (events: string[]) => [
          ...events.slice(0, 3),
          `event: response.failed\ndata: ${JSON.stringify({ type: 'response.failed', sequence_number: 3, response: { status: 'failed', error: { code: 'server_error', message: 'the model failed' } } })}\n\n`,
        ],
        'upstream_failed',
      ],
      [
        'sends an error event',
        (events: string[]) => [
          ...events.slice(0, 2),
          `event: error\ndata: ${JSON.stringify({ type: 'error', code: 'server_error', message: 'overloaded', param: null, sequence_number: 2 })}\n\n`,
        ],
        'upstream_failed',
      ],
      ['closes before its terminal event', (events: string[]) => events.slice(0, -1), 'broken_stream'],
      [
        'sends an event that is not JSON',
        (events: string[]) => [...events.slice(0, 2), 'data: {"type":"response.output_text.delta",\n\n'],
        'broken_stream',
      ],
    ])(
      'a stream that %s: relayed, then the error event; nothing stored, and the retry goes upstream',
      async (what, cut, outcome) => {
        const text = `unfinished: ${what}`;
        const k = key();
        const whole = eventsOf('whole the second time');
        const sent = cut(eventsOf('never whole'));
        let n = 0;
        replies.set(text, () => ({ kind: 'stream', events: ++n === 1 ? sent : whole }));
        const outcomes = () => metricValue(gateway.api.server, 'gateway_calls_total', { outcome });
        const before = await outcomes();
        const first = await post(streamOf(text), { 'idempotency-key': k });
        const body = await first.text();
        expect(body.endsWith(RESPONSES_BROKEN_STREAM_EVENT)).toBe(true);
        // What the provider sent of it came first, as it sent it (a malformed event is not relayed).
        const relayed = body.slice(0, -RESPONSES_BROKEN_STREAM_EVENT.length);
        expect(sent.join('').startsWith(relayed)).toBe(true);
        expect(relayed.length).toBeGreaterThan(0);
        await eventually(async () => ((await outcomes()) === before + 1 ? true : undefined), 5000, 'the outcome');
        await expect(redis.exists(recordKey(k))).resolves.toBe(0);
        // The SDK raises the error event as an APIError.
        const stream = await sdk().responses.create(streamOf(text), { headers: { 'Idempotency-Key': k } });
        const types: string[] = [];
        for await (const event of stream) types.push(event.type);
        expect(types.at(-1)).toBe('response.completed');
        expect(upstream(text)).toHaveLength(2);
      },
    );

    it('an SDK caller sees the broken stream as an APIError', async () => {
      const events = eventsOf('breaks for the SDK').slice(0, 4);
      replies.set('sdk sees a break', { kind: 'stream', events });
      const stream = await sdk().responses.create(streamOf('sdk sees a break'), {
        headers: { 'Idempotency-Key': key() },
      });
      let error: unknown;
      try {
        for await (const _event of stream);
      } catch (err) {
        error = err;
      }
      expect(error).toBeInstanceOf(APIError);
      expect((error as APIError).message).toMatch(/did not complete/);
    });

    it('attaches a duplicate that arrives mid-stream: the events so far, then the live ones, from one upstream call', async () => {
      const k = key();
      const events = eventsOf('one call and two callers reading it');
      const hold = heldStream(events, 4);
      replies.set('attach a response', hold.reply);
      const first = post(streamOf('attach a response'), { 'idempotency-key': k }).then((r) => r.text());
      await hold.reached;
      // Its head arrives with the events so far, while the provider still holds the rest.
      const duplicate = await post(streamOf('attach a response'), { 'idempotency-key': k });
      expect(duplicate.headers.get('idempotent-replayed')).toBe('true');
      hold.release();
      expect(await first).toBe(events.join(''));
      expect(await duplicate.text()).toBe(events.join(''));
      expect(upstream('attach a response')).toHaveLength(1);
    });

    it('keeps the upstream call running for a caller that leaves; its retry gets the whole stream, no second call', async () => {
      const k = key();
      const events = eventsOf('the caller left and the model went on');
      const hold = heldStream(events, 3);
      replies.set('leave a response', hold.reply);
      const controller = new AbortController();
      const stream = await sdk().responses.create(streamOf('leave a response'), {
        headers: { 'Idempotency-Key': k },
        signal: controller.signal,
      });
      let read = 0;
      for await (const _event of stream) {
        if (++read === 2) {
          controller.abort();
          break;
        }
      }
      hold.release();
      const retry = await post(streamOf('leave a response'), { 'idempotency-key': k });
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.text()).toBe(events.join(''));
      const [seen] = upstream('leave a response');
      expect(seen.closedEarly).toBe(false);
      expect(upstream('leave a response')).toHaveLength(1);
    });
  });

  describe('a response’s own routes: GET (and a resumed stream), cancel, DELETE, previous_response_id', () => {
    const get = (id: string, query = '', tenant: { key: string } = TENANT_A, method = 'GET') =>
      fetch(`${apiUrl}/v1/responses/${id}${query}`, { method, headers: { authorization: bearer(tenant) } });

    it('GET of a keyed whole response: from the record, byte for byte, with no upstream call', async () => {
      const created = await post(ask('get me whole'), { 'idempotency-key': key() });
      const body = await created.text();
      const id = (JSON.parse(body) as { id: string }).id;
      const routes = provider.responseRouteCalls.length;
      const read = await get(id);
      expect(read.status).toBe(200);
      expect(read.headers.get('x-gateway-upstream')).toBe('openai');
      expect(await read.text()).toBe(body);
      expect(provider.responseRouteCalls).toHaveLength(routes);
      const sdk_ = await sdk().responses.retrieve(id);
      expect(sdk_.output_text).toBe('Echo: get me whole');
    });

    it('GET of a keyed stream: its terminal event’s response; with stream=true, the events after starting_after', async () => {
      const events = eventsOf('a stream to read again later');
      const id = idOf(events);
      replies.set('stream to resume', { kind: 'stream', events });
      await (await post(streamOf('stream to resume'), { 'idempotency-key': key() })).text();
      const routes = provider.responseRouteCalls.length;
      const whole = await get(id);
      const terminal = dataOf(events.at(-1)!);
      expect(await whole.json()).toEqual(terminal.response);
      const all = await get(id, '?stream=true');
      expect(all.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
      expect(await all.text()).toBe(events.join(''));
      const after = await get(id, '?stream=true&starting_after=3');
      expect(await after.text()).toBe(events.filter((e) => seqOf(e) > 3).join(''));
      expect(provider.responseRouteCalls).toHaveLength(routes);
      expect(upstream('stream to resume')).toHaveLength(1);
    });

    it('resumes a stream that still runs: the events after starting_after, then the live ones, from one upstream call', async () => {
      const events = eventsOf('resumed while the model was still talking');
      const id = idOf(events);
      const hold = heldStream(events, 5);
      replies.set('resume live', hold.reply);
      // The first caller has the stream's first events (response.created names the id) when it loses it.
      const first = await readUntil(
        await post(streamOf('resume live'), { 'idempotency-key': key() }),
        '"sequence_number":2',
      );
      await hold.reached;
      // The first caller lost its stream after event 2; it resumes from there while the call runs.
      const resumed = await get(id, '?stream=true&starting_after=2');
      expect(resumed.status).toBe(200);
      hold.release();
      expect(await resumed.text()).toBe(events.filter((e) => seqOf(e) > 2).join(''));
      expect(await first.rest).toBe(events.join(''));
      expect(upstream('resume live')).toHaveLength(1);
    });

    it('never answers for one response with another: a broken stream’s id, retried under its key into a new response', async () => {
      const broken = eventsOf('this one breaks');
      const whole = eventsOf('this one completes');
      let n = 0;
      replies.set('one key, two responses', () => ({ kind: 'stream', events: ++n === 1 ? broken.slice(0, 3) : whole }));
      const k = key();
      await (await post(streamOf('one key, two responses'), { 'idempotency-key': k })).text();
      expect(await (await post(streamOf('one key, two responses'), { 'idempotency-key': k })).text()).toBe(
        whole.join(''),
      );
      const routes = provider.responseRouteCalls.length;
      // The record under the key is the second response's: the first one's GET is its upstream's to answer (404 here).
      expect((await get(idOf(broken))).status).toBe(404);
      expect((await get(idOf(broken), '?stream=true')).status).toBe(404);
      expect(provider.responseRouteCalls.slice(routes)).toEqual([
        `GET responses/${idOf(broken)}`,
        `GET responses/${idOf(broken)}?stream=true`,
      ]);
      expect(((await (await get(idOf(whole))).json()) as { id: string }).id).toBe(idOf(whole));
    });

    it('GET of a stream still running asks its upstream for the response as it stands, without waiting for the end', async () => {
      const events = eventsOf('still running when read');
      const id = idOf(events);
      const hold = heldStream(events, 3);
      replies.set('read while running', hold.reply);
      const first = await readUntil(
        await post(streamOf('read while running'), { 'idempotency-key': key() }),
        '"sequence_number":1',
      );
      await hold.reached;
      provider.responseRoute = (call) =>
        call === `GET responses/${id}`
          ? {
              kind: 'raw',
              status: 200,
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ id, status: 'in_progress' }),
            }
          : { kind: 'error', status: 404 };
      try {
        expect(await (await get(id)).json()).toEqual({ id, status: 'in_progress' });
      } finally {
        provider.responseRoute = () => ({ kind: 'error', status: 404 });
        hold.release();
      }
      expect(await first.rest).toBe(events.join(''));
    });

    it('a background response stored while queued: GET asks its upstream how it stands now', async () => {
      const id = `resp_bg_${randomUUID().replaceAll('-', '')}`;
      replies.set('in the background', {
        kind: 'raw',
        status: 200,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ id, object: 'response', status: 'queued', background: true }),
      });
      await post({ ...ask('in the background'), background: true }, { 'idempotency-key': key() });
      provider.responseRoute = (call) =>
        call === `GET responses/${id}`
          ? {
              kind: 'raw',
              status: 200,
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ id, status: 'completed' }),
            }
          : call === `GET responses/${id}/input_items?limit=2`
            ? {
                kind: 'raw',
                status: 200,
                headers: { 'content-type': 'application/json' },
                body: '{"object":"list","data":[]}',
              }
            : { kind: 'error', status: 404 };
      try {
        expect(await (await get(id)).json()).toEqual({ id, status: 'completed' });
        // The SDK's inputItems.list goes to the same upstream, tenant-checked as the rest.
        expect(await (await get(id, '/input_items?limit=2')).json()).toEqual({ object: 'list', data: [] });
        expect((await get(id, '/input_items', TENANT_B)).status).toBe(404);
      } finally {
        provider.responseRoute = () => ({ kind: 'error', status: 404 });
      }
    });

    it('a whole answer too large to store is still on record: its GET goes to its upstream', async () => {
      const id = `resp_big_${randomUUID().replaceAll('-', '')}`;
      replies.set('a huge response', {
        kind: 'huge',
        contentType: 'application/json',
        bytes: 5 * 1024 * 1024,
        prefix: `{"id":"${id}","object":"response","status":"completed","output_text":"`,
        suffix: '"}',
      });
      const res = await post(ask('a huge response'), { 'idempotency-key': key() });
      expect((await res.arrayBuffer()).byteLength).toBe(5 * 1024 * 1024);
      const routes = provider.responseRouteCalls.length;
      expect((await get(id)).status).toBe(404); // the fake upstream's answer: the gateway knew the id and asked
      expect(provider.responseRouteCalls.slice(routes)).toEqual([`GET responses/${id}`]);
    });

    it('tolerates a data: [DONE] after the terminal event (a compatible proxy’s habit): stored and replayed', async () => {
      const events = [...eventsOf('done twice'), 'data: [DONE]\n\n'];
      replies.set('done twice', { kind: 'stream', events });
      const k = key();
      expect(await (await post(streamOf('done twice'), { 'idempotency-key': k })).text()).toBe(events.join(''));
      const replay = await post(streamOf('done twice'), { 'idempotency-key': k });
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(await replay.text()).toBe(events.join(''));
      expect(upstream('done twice')).toHaveLength(1);
    });

    it('a keyless response is asked of the upstream that made it: GET, cancel and DELETE forwarded; after DELETE it is gone', async () => {
      const created = await sdk().responses.create(ask('keyless then looked up'));
      const id = created.id;
      provider.responseRoute = (call) =>
        call === `GET responses/${id}`
          ? {
              kind: 'raw',
              status: 200,
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ id, object: 'response', status: 'completed', from: 'upstream' }),
            }
          : {
              kind: 'raw',
              status: 200,
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ id, deleted: true }),
            };
      try {
        const read = await get(id);
        expect(await read.json()).toMatchObject({ id, from: 'upstream' });
        expect((await get(id, '/cancel', TENANT_A, 'POST')).status).toBe(200);
        expect((await get(id, '', TENANT_A, 'DELETE')).status).toBe(200);
        expect(provider.responseRouteCalls.slice(-3)).toEqual([
          `GET responses/${id}`,
          `POST responses/${id}/cancel`,
          `DELETE responses/${id}`,
        ]);
        expect((await get(id)).status).toBe(404);
      } finally {
        provider.responseRoute = () => ({ kind: 'error', status: 404 });
      }
    });

    it('is the tenant’s own: another tenant gets 404 on GET, stream, cancel and DELETE, and nothing goes upstream', async () => {
      const created = await sdk().responses.create(ask('mine alone'), { headers: { 'Idempotency-Key': key() } });
      const routes = provider.responseRouteCalls.length;
      for (const [query, method] of [
        ['', 'GET'],
        ['?stream=true', 'GET'],
        ['/cancel', 'POST'],
        ['', 'DELETE'],
      ]) {
        const res = await get(created.id, query, TENANT_B, method);
        expect(res.status).toBe(404);
        expect(await res.json()).toMatchObject({ error: { code: 'response_not_found' } });
      }
      expect((await get('resp_unknown0123')).status).toBe(404);
      expect(provider.responseRouteCalls).toHaveLength(routes);
      expect((await get(created.id)).status).toBe(200);
    });

    it('previous_response_id: the tenant’s own goes on; another tenant’s or an unknown one is 400, nothing upstream', async () => {
      const first = await sdk().responses.create(ask('a conversation starts'));
      const next = await sdk().responses.create({ ...ask('and goes on'), previous_response_id: first.id });
      expect(next.output_text).toBe('Echo: and goes on');
      expect(upstream('and goes on')[0].body.previous_response_id).toBe(first.id);
      for (const [tenant, id] of [
        [TENANT_B, first.id],
        [TENANT_A, 'resp_never_made_here'],
      ] as const) {
        const res = await post({ ...ask('borrowed context'), previous_response_id: id }, {}, tenant);
        expect(res.status).toBe(400);
        expect(await res.json()).toMatchObject({
          error: { code: 'previous_response_not_found', param: 'previous_response_id' },
        });
      }
      expect(upstream('borrowed context')).toHaveLength(0);
    });

    it.each([
      ['?stream=yes', 'stream'],
      ['?stream=true&starting_after=-1', 'starting_after'],
      ['?stream=true&starting_after=two', 'starting_after'],
    ])('GET with %s: 400', async (query, param) => {
      const created = await sdk().responses.create(ask(`bad query ${param}`));
      const res = await get(created.id, query);
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({ error: { param } });
    });
  });

  describe('Idempotency-Scope: one header for an agent’s whole run', () => {
    /** An agent's client: the same headers on every call of the run, as the AI SDK and the Agents SDK send them. */
    const agent = (scope: string, tenant: { key: string } = TENANT_A) =>
      new OpenAI({
        apiKey: tenant.key,
        baseURL: `${apiUrl}/v1`,
        maxRetries: 0,
        defaultHeaders: { 'Idempotency-Scope': scope },
      });

    it('makes each distinct request of the run its own operation, and a re-run of the run replays every step', async () => {
      const scope = `run-${randomUUID()}`;
      const steps = ['scope step one', 'scope step two', 'scope step three'];
      const run = async () => {
        const client = agent(scope);
        const answers: string[] = [];
        for (const step of steps) answers.push((await client.responses.create(ask(step))).output_text);
        // One step through chat completions too: the scope holds on every gateway route.
        const chat = await client.chat.completions.create({
          model: 'gpt-test',
          messages: [{ role: 'user', content: 'scope step chat' }],
        });
        return [...answers, chat.choices[0].message.content];
      };
      const first = await run();
      expect(first).toEqual([...steps, 'scope step chat'].map((s) => `Echo: ${s}`));
      const again = await run();
      expect(again).toEqual(first);
      // One upstream call per distinct request, none for the re-run.
      for (const step of [...steps, 'scope step chat']) expect(upstream(step)).toHaveLength(1);
      const keys = steps.map((s) => upstream(s)[0].headers['idempotency-key']);
      expect(new Set(keys).size).toBe(3);
      const replayed = await post(ask('scope step two'), { 'idempotency-scope': scope });
      expect(replayed.headers.get('idempotent-replayed')).toBe('true');
    });

    it('keeps two tenants’ runs apart under the same scope', async () => {
      const scope = `run-${randomUUID()}`;
      await agent(scope, TENANT_A).responses.create(ask('scoped for two tenants'));
      await agent(scope, TENANT_B).responses.create(ask('scoped for two tenants'));
      expect(upstream('scoped for two tenants')).toHaveLength(2);
    });

    it.each([
      ['both headers', { 'idempotency-key': `k-${randomUUID()}`, 'idempotency-scope': `s-${randomUUID()}` }],
      ['a scope too short', { 'idempotency-scope': 'short' }],
      ['a scope with a comma', { 'idempotency-scope': 'run-0123456789,abcdef' }],
    ])('%s: 400 idempotency_key_invalid, x-should-retry false, nothing upstream', async (_, headers) => {
      const text = `bad scope ${randomUUID()}`;
      const res = await post(ask(text), headers);
      expect(res.status).toBe(400);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(await res.json()).toMatchObject({ error: { code: 'idempotency_key_invalid' } });
      expect(upstream(text)).toHaveLength(0);
    });
  });

  describe('bad input', () => {
    it.each([
      ['a body that is not an object', '[1,2]', 'body'],
      ['no model', { input: 'hi' }, 'model'],
      ['a model that is not a string', { model: 7, input: 'hi' }, 'model'],
      ['an input that is a number', { model: 'gpt-test', input: 42 }, 'input'],
      ['stream as a string', { model: 'gpt-test', input: 'hi', stream: 'yes' }, 'stream'],
      [
        'previous_response_id as a number',
        { model: 'gpt-test', input: 'hi', previous_response_id: 5 },
        'previous_response_id',
      ],
      // A conversation lives in the provider account every tenant shares, with no owner the gateway knows.
      ['a conversation', { model: 'gpt-test', input: 'hi', conversation: 'conv_123' }, 'conversation'],
    ])('%s: 400 in the envelope, x-should-retry false, nothing upstream or stored', async (_, body, param) => {
      const k = key();
      const calls = provider.calls;
      const res = await post(body, { 'idempotency-key': k });
      expect(res.status).toBe(400);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(await res.json()).toMatchObject({ error: { type: 'invalid_request_error', param } });
      expect(provider.calls).toBe(calls);
      await expect(redis.exists(recordKey(k))).resolves.toBe(0);
    });

    it('a bad API key: 401 in the envelope with x-should-retry false', async () => {
      const res = await post(ask('no such key'), {}, { key: 'not-a-key-of-anyone' });
      expect(res.status).toBe(401);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(await res.json()).toMatchObject({ error: { code: 'invalid_api_key' } });
      expect(upstream('no such key')).toHaveLength(0);
    });
  });
});

describe('the built-in fake model (LLM_PROVIDER=fake) speaks the Responses API', () => {
  it('answers responses.create and responses.stream through the gateway', async () => {
    const api = await startApi({ env: { LLM_PROVIDER: 'fake' } });
    try {
      await api.app.listen(0, '127.0.0.1');
      const { port } = api.server.address() as { port: number };
      const client = new OpenAI({ apiKey: TENANT_A.key, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
      const whole = await client.responses.create({ model: 'gpt-test', input: 'hello there' });
      expect(whole.output_text).toBe('This is the built-in fake model. You wrote: "hello there"');
      const streamed = await client.responses
        .stream({ model: 'gpt-test', input: [{ role: 'user', content: 'and streamed' }] })
        .finalResponse();
      expect(streamed.output_text).toBe('This is the built-in fake model. You wrote: "and streamed"');
      const cut = await client.responses.create({ model: 'gpt-test', input: 'cut me', max_output_tokens: 3 });
      expect(cut.status).toBe('incomplete');
      expect(cut.incomplete_details?.reason).toBe('max_output_tokens');
    } finally {
      await api.close();
    }
  });
});

describe('a response’s own routes on the PostgreSQL store (IDEMPOTENCY_STORE=postgres)', () => {
  let gateway: GatewayHarness;
  beforeAll(async () => {
    gateway = await startGateway({ IDEMPOTENCY_STORE: 'postgres' });
  });
  afterAll(() => gateway.close());
  const post = (body: object, key: string) =>
    fetch(`${gateway.apiUrl}/v1/responses`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(body),
    });
  const get = (id: string, query = '') =>
    fetch(`${gateway.apiUrl}/v1/responses/${id}${query}`, { headers: { authorization: bearer(TENANT_A) } });

  it('reads a keyed response and resumes its stream from the PostgreSQL record, live, with no upstream call', async () => {
    const whole = await post({ model: 'gpt-test', input: 'pg whole' }, `pg-${randomUUID()}`);
    const body = await whole.text();
    expect(await (await get((JSON.parse(body) as { id: string }).id)).text()).toBe(body);
    const events = eventsOf('a stream kept in PostgreSQL');
    const id = idOf(events);
    const hold = heldStream(events, 4);
    gateway.replies.set('pg stream', hold.reply);
    const first = await readUntil(
      await post({ model: 'gpt-test', input: 'pg stream', stream: true }, `pg-${randomUUID()}`),
      '"sequence_number":1',
    );
    await hold.reached;
    const resumed = await get(id, '?stream=true&starting_after=1');
    hold.release();
    expect(await resumed.text()).toBe(events.filter((e) => seqOf(e) > 1).join(''));
    expect(await first.rest).toBe(events.join(''));
    expect(gateway.provider.responseRouteCalls).toEqual([]);
    expect(gateway.upstreamCalls('pg stream')).toHaveLength(1);
  });
});
