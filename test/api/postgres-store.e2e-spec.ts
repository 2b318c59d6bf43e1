import { fingerprintBody, IdempotencyProblemTypes, legacyFingerprint } from '@app/idempotency';
import { JOBS_STREAM } from '@app/summary-queue';
import { PostgresIdempotencyStore } from '@app/persistence';
import type { Redis } from 'ioredis';
import OpenAI from 'openai';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { bearer, type ApiHarness, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { completionEvents, FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, freePort, freshRedis, testDatabaseUrl, testDataSource, testRedisUrl } from '../support/infra';

/**
 * The api with IDEMPOTENCY_STORE=postgres: the summaries and gateway routes
 * keep their records in idempotency_keys (and streamed answers in
 * idempotency_frames), none in Redis. Effects asserted: jobs enqueued,
 * upstream calls, rows written.
 */
describe('the api on the PostgreSQL idempotency store', () => {
  let provider: FakeOpenAiServer;
  let api: ApiHarness;
  let apiUrl: string;
  let redis: Redis;
  let ds: DataSource;
  let replies: Map<string, ModelReply>;
  const summary = { text: 'The quick brown fox jumps over the lazy dog.', notify: 'ops@example.com' };
  const env = { IDEMPOTENCY_STORE: 'postgres', LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'sk-upstream' };
  const rowOf = async (key: string) => (await ds.query(`SELECT * FROM idempotency_keys WHERE key = $1`, [key]))[0];
  const until = (condition: () => boolean, what: string) =>
    eventually(() => (condition() ? true : undefined), 5000, what);
  /** The frames of `key`'s running attempt stored so far, joined: what a duplicate attaching now can read. */
  const framesStored = async (key: string): Promise<string> => {
    const rows = await ds.query<{ data: string }[]>(
      `SELECT f.data FROM idempotency_frames f JOIN idempotency_keys k ON k.attempt = f.attempt
        WHERE k.key = $1 AND f.kind = 'frame' ORDER BY f.seq`,
      [key],
    );
    return rows.map((r) => r.data).join('');
  };
  /** Until the frames the upstream sent before its gate (`sent`) are all in `key`'s log: the stream is under way. */
  const streamUnderWay = (key: string, sent: readonly string[]) =>
    eventually(
      async () => ((await framesStored(key)) === sent.join('') ? true : undefined),
      5000,
      'the frames sent so far to be stored',
    );
  const streamOf = (text: string) => ({
    model: 'gpt-test',
    messages: [{ role: 'user' as const, content: text }],
    stream: true as const,
  });
  const chat = (body: unknown, key: string, url = apiUrl) =>
    fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(body),
    }).then(async (r) => ({ headers: r.headers, text: await r.text() }));

  beforeAll(async () => {
    redis = await freshRedis();
    ds = await testDataSource();
    replies = new Map();
    provider = await new FakeOpenAiServer(
      async (_n, text) => replies.get(text) ?? { kind: 'complete', content: `Echo: ${text}` },
    ).start();
    api = await startApi({ env: { ...env, OPENAI_BASE_URL: provider.baseUrl } });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await api.close();
    await provider.stop();
    await ds.destroy();
    redis.disconnect();
  });

  const postSummary = (key: string) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(summary);

  it('replays a summary request from its row: one job, nothing in Redis but the job', async () => {
    const key = `key-${randomUUID()}`;
    const before = await redis.xlen(JOBS_STREAM);
    const first = await postSummary(key).expect(202);
    const replay = await postSummary(key).expect(202);
    expect(replay.body).toEqual(first.body);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await redis.xlen(JOBS_STREAM)).toBe(before + 1);
    expect(await redis.keys('idem:*')).toEqual([]);
    const row = await rowOf(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    expect(row).toMatchObject({
      state: 'completed',
      token: null,
      status: 202,
      fingerprint: fingerprintBody(summary),
      streamed: false,
    });
    expect(JSON.parse(row.body)).toEqual(first.body);
  });

  it('replays a record stored before fingerprints were versioned (a bare SHA-256), and enqueues nothing', async () => {
    const key = `key-${randomUUID()}`;
    const operation = `${TENANT_A.tenant}:POST:/v1/summaries:${key}`;
    const old = new PostgresIdempotencyStore(ds);
    const stored = { job_id: 'job-from-the-version-before', status: 'queued' };
    try {
      await old.claim(operation, 'the-version-before', legacyFingerprint(summary), 10_000);
      await expect(
        old.complete(
          operation,
          'the-version-before',
          legacyFingerprint(summary),
          { status: 202, headers: { 'content-type': 'application/json' }, body: Buffer.from(JSON.stringify(stored)) },
          60_000,
        ),
      ).resolves.toBe(true);
      const before = await redis.xlen(JOBS_STREAM);
      const replay = await postSummary(key).expect(202);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual(stored);
      expect(await redis.xlen(JOBS_STREAM)).toBe(before);
    } finally {
      await old.close();
    }
  });

  it('answers 409 with Retry-After while another request holds the key, and enqueues nothing', async () => {
    const key = `key-${randomUUID()}`;
    const other = new PostgresIdempotencyStore(ds);
    try {
      await other.claim(
        `${TENANT_A.tenant}:POST:/v1/summaries:${key}`,
        'other-request',
        fingerprintBody(summary),
        12_500,
      );
      const before = await redis.xlen(JOBS_STREAM);
      const res = await postSummary(key).expect(409);
      expect(res.body.type).toBe(IdempotencyProblemTypes.inProgress);
      expect(Number(res.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(await redis.xlen(JOBS_STREAM)).toBe(before);
      expect(await rowOf(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`)).toMatchObject({
        state: 'running',
        token: 'other-request',
      });
    } finally {
      await other.close();
    }
  });

  it('stores a gateway stream frame by frame and replays its bytes, with one upstream call', async () => {
    const key = `gw-${randomUUID()}`;
    const events = completionEvents('stored in postgres, replayed from it');
    replies.set('pg replay', { kind: 'stream', events });
    const first = await chat(streamOf('pg replay'), key);
    const replay = await chat(streamOf('pg replay'), key);
    expect(first.text).toBe(events.join(''));
    expect(replay.text).toBe(events.join(''));
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(provider.requests.filter((r) => r.userText === 'pg replay')).toHaveLength(1);
    const row = await rowOf(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`);
    expect(row).toMatchObject({ state: 'completed', status: 200, body: '', streamed: true });
    const frames = await ds.query(
      `SELECT kind, data FROM idempotency_frames WHERE attempt = $1 AND kind IN ('frame', 'end') ORDER BY seq`,
      [row.attempt],
    );
    expect(
      frames
        .filter((f: { kind: string }) => f.kind === 'frame')
        .map((f: { data: string }) => f.data)
        .join(''),
    ).toBe(events.join(''));
    expect(frames[frames.length - 1]).toEqual({ kind: 'end', data: 'completed' });
  });

  it('attaches a duplicate that arrives mid-stream to the running call: the same events, one upstream call', async () => {
    const key = `gw-${randomUUID()}`;
    const events = completionEvents('one call, two callers, one postgres frame log', { usage: true });
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    replies.set('pg attach', { kind: 'stream', events, gate: (i) => (i === 3 ? held : Promise.resolve()) });
    const first = chat(streamOf('pg attach'), key);
    await until(() => provider.requests.some((r) => r.userText === 'pg attach'), 'the upstream call');
    await streamUnderWay(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`, events.slice(0, 3));
    const duplicate = chat(streamOf('pg attach'), key);
    // The duplicate follows the running call: it registers on its row (watched) while the call still runs, held.
    await eventually(
      async () => ((await rowOf(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`))?.watched ? true : undefined),
      5000,
      'the duplicate to follow the running call',
    );
    expect(await rowOf(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`)).toMatchObject({
      state: 'running',
      watched: true,
    });
    release();
    const [a, b] = await Promise.all([first, duplicate]);
    expect(a.text).toBe(events.join(''));
    expect(b.text).toBe(events.join(''));
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(provider.requests.filter((r) => r.userText === 'pg attach')).toHaveLength(1);
  });

  describe('across api processes', () => {
    let other: AppProcess;
    beforeAll(async () => {
      other = await startAppProcess('api', freePort(71), {
        ...env,
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key},${TENANT_B.tenant}:${TENANT_B.key}`,
        LOG_LEVEL: 'warn',
        OPENAI_BASE_URL: provider.baseUrl,
      });
    }, 60_000);
    afterAll(async () => {
      other.kill('SIGTERM');
      await other.exited;
    });

    it('attaches a duplicate that reaches another api process to the running stream', async () => {
      const key = `gw-${randomUUID()}`;
      const events = completionEvents('a retry on another pod reads the same rows', { usage: true });
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set('pg other pod', { kind: 'stream', events, gate: (i) => (i === 2 ? held : Promise.resolve()) });
      const first = chat(streamOf('pg other pod'), key);
      await until(() => provider.requests.some((r) => r.userText === 'pg other pod'), 'the upstream call');
      await streamUnderWay(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`, events.slice(0, 2));
      const stream = await new OpenAI({
        apiKey: TENANT_A.key,
        baseURL: `${other.url}/v1`,
        maxRetries: 0,
      }).chat.completions.create(streamOf('pg other pod'), { headers: { 'Idempotency-Key': key } });
      const chunks: string[] = [];
      const reading = (async () => {
        for await (const chunk of stream) chunks.push(JSON.stringify(chunk));
      })();
      // The other pod follows the running call: the frames sent before the gate reach its caller while it is held.
      await until(() => chunks.length === 2, 'the duplicate to read the frames sent so far');
      expect(await rowOf(`${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`)).toMatchObject({
        state: 'running',
        watched: true,
      });
      release();
      await reading;
      expect((await first).text).toBe(events.join(''));
      expect(chunks.map((c) => `data: ${c}\n\n`)).toEqual(events.slice(0, -1));
      expect(provider.requests.filter((r) => r.userText === 'pg other pod')).toHaveLength(1);
      expect(await redis.keys('idem:*')).toEqual([]);
    });
  });
});
