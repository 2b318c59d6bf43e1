import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { DataSource, QueryRunner } from 'typeorm';
import { bearer, type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, testDataSource } from '../support/infra';

/**
 * A keyed chat-completions stream ends for its caller with its last event, not after its record is written
 * (`attach.endStreamsFirst`): the caller waits for no store. The record is held in a PostgreSQL row lock taken
 * before the last event, so the store can write nothing more until the test lets it: the caller's stream still
 * ends, the record is completed once the lock goes, and a retry replays it without a second upstream call. A
 * gateway that completed the record first would keep the caller's stream open for as long as the lock is held.
 */
describe('a keyed gateway stream ends before its record is completed (IDEMPOTENCY_STORE=postgres)', () => {
  let provider: FakeOpenAiServer;
  let api: ApiHarness;
  let apiUrl: string;
  let ds: DataSource;
  const replies = new Map<string, ModelReply>();
  const callsFor = (text: string) => provider.requests.filter((r) => r.userText === text).length;

  const chat = (text: string, key: string) =>
    fetch(`${apiUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: text }], stream: true }),
    });
  const stateOf = async (key: string): Promise<string | undefined> => {
    const [row] = await ds.query<{ state: string }[]>(`SELECT state FROM idempotency_keys WHERE key = $1`, [
      `${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`,
    ]);
    return row?.state;
  };

  beforeAll(async () => {
    ds = await testDataSource();
    provider = await new FakeOpenAiServer(
      async (_n, text) => replies.get(text) ?? { kind: 'complete', content: `Echo: ${text}` },
    ).start();
    api = await startApi({
      env: {
        IDEMPOTENCY_STORE: 'postgres',
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

  it('the caller has its whole stream while the store is held; the record completes after, and replays', async () => {
    const text = `ends first ${randomUUID()}`;
    const key = `se-${randomUUID()}`;
    const events = [
      'data: {"id":"chatcmpl-e","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
      'data: {"id":"chatcmpl-e","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
      'data: [DONE]\n\n',
    ];
    let reached!: () => void;
    const atLast = new Promise<void>((r) => (reached = r));
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    replies.set(text, {
      kind: 'stream',
      events,
      gate: (i) => {
        if (i !== events.length - 1) return Promise.resolve();
        reached();
        return released;
      },
    });

    const first = await chat(text, key);
    expect(first.status).toBe(200);
    const body = first.text();
    await atLast;
    // The row is locked before the last event: no append and no completion can be written until it is let go.
    const lock: QueryRunner = ds.createQueryRunner();
    await lock.connect();
    try {
      await lock.startTransaction();
      await lock.query(`SELECT 1 FROM idempotency_keys WHERE key = $1 FOR UPDATE`, [
        `${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`,
      ]);
      release();
      expect(await body).toBe(events.join(''));
      expect(await stateOf(key)).toBe('running');
    } finally {
      await lock.rollbackTransaction();
      await lock.release();
    }

    await eventually(async () => ((await stateOf(key)) === 'completed' ? true : undefined), 5000, 'the record');
    const replay = await chat(text, key);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(events.join(''));
    expect(callsFor(text)).toBe(1);
  }, 15_000);
});
