import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { DataSource } from 'typeorm';
import { bearer, type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { testDataSource } from '../support/infra';

/**
 * A provider's answer is relayed and stored as its bytes, whatever they are,
 * on either idempotency store: a NUL (which a PostgreSQL text column refused,
 * so the answer was never stored and every retry called the provider again),
 * and bytes that are not UTF-8 (which callers got as U+FFFD). Each case: the
 * first caller gets the provider's bytes, a retry with the key gets the same
 * bytes replayed, and the provider was called once.
 */
describe.each(['redis', 'postgres'] as const)('the gateway relays and stores bytes (IDEMPOTENCY_STORE=%s)', (store) => {
  let provider: FakeOpenAiServer;
  let api: ApiHarness;
  let apiUrl: string;
  let ds: DataSource;
  const replies = new Map<string, ModelReply>();
  const callsFor = (text: string) => provider.requests.filter((r) => r.userText === text).length;

  /** The caller's view: status, headers and the body's bytes exactly as they came. */
  const chat = async (text: string, key: string, stream: boolean) => {
    const res = await fetch(`${apiUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: text }], stream }),
    });
    return { status: res.status, headers: res.headers, bytes: Buffer.from(await res.arrayBuffer()) };
  };

  const sse = (...parts: (string | number[])[]): Buffer =>
    Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p) : Buffer.from(p))));
  const chunk = (content: (string | number[])[]): Buffer =>
    sse(
      'data: {"id":"chatcmpl-b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"',
      ...content,
      '"}}]}\n\n',
    );
  const completion = (content: (string | number[])[]): Buffer =>
    sse(
      '{"id":"chatcmpl-b","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"',
      ...content,
      '"},"finish_reason":"stop"}]}',
    );

  beforeAll(async () => {
    ds = await testDataSource();
    provider = await new FakeOpenAiServer(
      async (_n, text) => replies.get(text) ?? { kind: 'complete', content: `Echo: ${text}` },
    ).start();
    api = await startApi({
      env: {
        IDEMPOTENCY_STORE: store,
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'sk-upstream',
        OPENAI_BASE_URL: provider.baseUrl,
      },
    });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await api.close();
    await provider.stop();
    await ds.destroy();
  });

  /** In PostgreSQL mode, the answer is in its row (or its frame log), not only sent. */
  async function expectStoredInPostgres(key: string, streamed: boolean): Promise<void> {
    if (store !== 'postgres') return;
    const [row] = await ds.query(`SELECT state, streamed FROM idempotency_keys WHERE key = $1`, [
      `${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`,
    ]);
    expect(row).toEqual({ state: 'completed', streamed });
  }

  const streams: [string, Buffer[]][] = [
    ['a raw NUL byte in an event', [chunk(['a', [0x00], 'b']), sse('data: [DONE]\n\n')]],
    // A regression guard, not a fix: JSON's escape is plain text, and it passed before as well.
    ['a \\u0000 escape in an event (regression guard)', [chunk(['a\\u0000b']), sse('data: [DONE]\n\n')]],
    [
      'bytes that are not UTF-8 in an event',
      [chunk(['caf', [0xff, 0xfe], ' ', [0xc3]]), chunk([[0xe2, 0x82], 'x']), sse('data: [DONE]\n\n')],
    ],
  ];
  it.each(streams)(
    'a stream holding %s: the same bytes first and replayed, one upstream call',
    async (what, events) => {
      const text = `stream ${what} ${store}`;
      const key = `gb-${randomUUID()}`;
      replies.set(text, { kind: 'stream', events });
      const whole = Buffer.concat(events);

      const first = await chat(text, key, true);
      expect(first.status).toBe(200);
      expect(first.bytes.equals(whole)).toBe(true);
      await expectStoredInPostgres(key, true);

      const replay = await chat(text, key, true);
      expect(replay.status).toBe(200);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(whole)).toBe(true);
      expect(callsFor(text)).toBe(1);
    },
  );

  const bodies: [string, Buffer][] = [
    ['a raw NUL byte', completion(['a', [0x00], 'b'])],
    // A regression guard, as above.
    ['a \\u0000 escape (regression guard)', completion(['a\\u0000b'])],
    ['bytes that are not UTF-8', completion(['caf', [0xff, 0xfe], ' ', [0xc3]])],
  ];
  it.each(bodies)(
    'a whole answer holding %s: the same bytes first and replayed, one upstream call',
    async (what, body) => {
      const text = `whole ${what} ${store}`;
      const key = `gb-${randomUUID()}`;
      replies.set(text, { kind: 'raw', status: 200, headers: { 'content-type': 'application/json' }, body });

      const first = await chat(text, key, false);
      expect(first.status).toBe(200);
      expect(first.bytes.equals(body)).toBe(true);
      await expectStoredInPostgres(key, false);

      const replay = await chat(text, key, false);
      expect(replay.status).toBe(200);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.bytes.equals(body)).toBe(true);
      expect(callsFor(text)).toBe(1);
    },
  );
});
