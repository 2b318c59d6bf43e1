import { CONSUMER_GROUP, DEAD_LETTER_STREAM, fieldsOf, jobIdFor, JOBS_STREAM } from '@app/summary-queue';
import { Cluster } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { bearer, startApi, TENANT_A, type ApiHarness } from '../support/api-harness';
import { completionEvents, FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, testDataSource, truncateAll } from '../support/infra';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * The api (idempotency included) and the worker on a local Redis Cluster,
 * three masters with a replica each: the same answers and effects as on one
 * Redis. Effects are read back through a Cluster client of the test's own
 * (stream entries, records), from PostgreSQL (rows) and from the fake model
 * (calls).
 */
describe('the api and the worker on a Redis Cluster', () => {
  let redisCluster: RedisCluster;
  let cluster: Cluster;
  let model: FakeOpenAiServer;
  let api: ApiHarness;
  let apiUrl: string;
  let worker: WorkerHarness;
  let db: DataSource;
  /** The model's answer per user text; a short summary otherwise. */
  const replies = new Map<string, ModelReply | (() => ModelReply)>();

  const text = 'Redis Cluster keeps each key on one master; the hash tags keep what goes together on one slot.';
  const body = { text, notify: 'someone@example.com' };
  const newKey = () => `cluster-${randomUUID()}`;
  const post = (key: string, payload: object = body) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(payload);
  const entries = async () =>
    (await cluster.xrange(JOBS_STREAM, '-', '+')).map(([id, flat]) => ({ id, fields: fieldsOf(flat) }));
  const pendingCount = async () => Number(((await cluster.xpending(JOBS_STREAM, CONSUMER_GROUP)) as [number])[0]);

  beforeAll(async () => {
    redisCluster = await startRedisCluster();
    cluster = new Cluster([...redisCluster.seedNodes], {
      scaleReads: 'master',
      redisOptions: { disconnectTimeout: 100 },
    });
    cluster.on('error', () => undefined);
    await new Promise((resolve) => cluster.once('ready', resolve));
    db = await testDataSource();
    await truncateAll(db);
    model = await new FakeOpenAiServer((_n, userText) => {
      const reply = replies.get(userText);
      if (reply === undefined) return { kind: 'complete', content: 'A short summary.' };
      return typeof reply === 'function' ? reply() : reply;
    }).start();
    const env = { REDIS_CLUSTER_NODES: redisCluster.seedNodesEnv };
    api = await startApi({
      env: { ...env, LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'sk-upstream', OPENAI_BASE_URL: model.baseUrl },
    });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    worker = await startWorker({ modelUrl: model.baseUrl, env });
  }, 60_000);

  afterAll(async () => {
    await worker?.close();
    await api?.close();
    await model?.stop();
    await db?.destroy();
    cluster?.disconnect();
    await redisCluster?.stop();
  });

  it('runs on the cluster: the shared clients are Cluster clients', () => {
    expect(api.client).toBeInstanceOf(Cluster);
    expect(worker.redis).toBeInstanceOf(Cluster);
  });

  it('new key: 202 and one stream entry; same key and body: the stored answer, replayed, no second entry', async () => {
    const key = newKey();
    const before = (await entries()).length;
    const first = await post(key).expect(202);
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    expect(first.body).toEqual({ job_id: jobId, status: 'queued' });
    const after = await entries();
    expect(after).toHaveLength(before + 1);
    expect(after.filter((e) => e.fields.job_id === jobId)).toHaveLength(1);

    const replay = await post(key, { notify: body.notify, text }).expect(202);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(first.body);
    expect(replay.headers.location).toBe(first.headers.location);
    expect(await entries()).toHaveLength(before + 1);
    // The record lives on the master of its own slot.
    const record = `idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`;
    expect(await cluster.hget(record, 'state')).toBe('completed');
  });

  it('a key with braces (a hash tag of its own, or a lone `}`) is kept whole: 202, then the stored answer', async () => {
    for (const key of [`{tag}-${randomUUID()}`, `a}b-${randomUUID()}`, `}{x}-${randomUUID()}`]) {
      const before = (await entries()).length;
      const first = await post(key).expect(202);
      const replay = await post(key).expect(202);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual(first.body);
      expect(await entries()).toHaveLength(before + 1);
    }
  });

  it('same key, other body: 422, nothing enqueued', async () => {
    const key = newKey();
    await post(key).expect(202);
    const before = (await entries()).length;
    const other = await post(key, { ...body, text: 'another text' }).expect(422);
    expect(other.headers['content-type']).toMatch(/application\/problem\+json/);
    expect(await entries()).toHaveLength(before);
  });

  it('two concurrent requests with one key: one job', async () => {
    const key = newKey();
    const before = (await entries()).length;
    const answers = await Promise.all([post(key), post(key), post(key)]);
    const statuses = answers.map((a) => a.status);
    expect(statuses.filter((s) => s === 202).length).toBeGreaterThanOrEqual(1);
    expect(statuses.every((s) => s === 202 || s === 409)).toBe(true);
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    expect((await entries()).filter((e) => e.fields.job_id === jobId)).toHaveLength(1);
    expect(await entries()).toHaveLength(before + 1);
  });

  it('the worker turns each entry into one summary and one outbox row and acks it; GET says done', async () => {
    const key = newKey();
    await post(key).expect(202);
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const jobs = new Set((await entries()).map((e) => e.fields.job_id));
    const callsBefore = model.calls;
    for (let turn = 0; turn < 10 && (await entries()).length > 0; turn++) await worker.consumer.runOnce();
    expect(await entries()).toHaveLength(0);
    expect(await pendingCount()).toBe(0);
    expect(model.calls - callsBefore).toBe(jobs.size);
    const rows = await db.query<{ job_id: string }[]>('SELECT job_id FROM summaries');
    expect(rows.map((r) => r.job_id).sort()).toEqual([...jobs].sort());
    const outbox = await db.query<{ dedupe_key: string }[]>('SELECT dedupe_key FROM outbox');
    expect(outbox.map((r) => r.dedupe_key).sort()).toEqual([...jobs].map((j) => `summary_ready:${j}`).sort());

    const status = await request(api.server)
      .get(`/v1/summaries/${jobId}`)
      .set('Authorization', bearer(TENANT_A))
      .expect(200);
    expect(status.body).toMatchObject({ job_id: jobId, status: 'done', summary: 'A short summary.' });
  });

  it('a poison job is dead-lettered after one model call, and its job is marked failed', async () => {
    const poison = 'a text the model refuses with a 400, every time';
    replies.set(poison, { kind: 'error', status: 400 });
    const key = newKey();
    await post(key, { ...body, text: poison }).expect(202);
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const callsBefore = model.requests.filter((r) => r.userText === poison).length;
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(model.requests.filter((r) => r.userText === poison).length - callsBefore).toBe(1);
    const dead = (await cluster.xrange(DEAD_LETTER_STREAM, '-', '+')).map(([, flat]) => fieldsOf(flat));
    expect(dead.filter((d) => d.job_id === jobId)).toEqual([expect.objectContaining({ reason: 'llm_client' })]);
    expect(await entries()).toHaveLength(0);
    expect(await pendingCount()).toBe(0);
    expect(await db.query('SELECT 1 FROM summaries WHERE job_id = $1', [jobId])).toHaveLength(0);
    const status = await request(api.server)
      .get(`/v1/summaries/${jobId}`)
      .set('Authorization', bearer(TENANT_A))
      .expect(200);
    expect(status.body).toMatchObject({ job_id: jobId, status: 'failed' });
  });

  describe('the gateway, POST /v1/chat/completions', () => {
    const streamOf = (userText: string) => ({
      model: 'gpt-test',
      messages: [{ role: 'user', content: userText }],
      stream: true,
    });
    /** A call whose answer's head (`head`: fetch resolves once the headers came) and whole body can be awaited. */
    const open = (payload: object, key: string) => {
      const head = fetch(`${apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify(payload),
      });
      const answer = head.then(async (r) => ({ status: r.status, headers: r.headers, text: await r.text() }));
      return { head, answer };
    };
    const chat = (payload: object, key: string) => open(payload, key).answer;
    /**
     * Whether the running request with this key has started its answer: its record holds the head it streams under
     * (written with the first frame of the frames followers read).
     */
    const streaming = async (key: string) =>
      (await cluster.hget(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:${key}`, 'head')) !== null;

    it('attaches a second identical stream request to the running one: the same events, one upstream call', async () => {
      const userText = `attach on a cluster ${randomUUID()}`;
      const events = completionEvents('one call, two callers, the same words on a cluster', { usage: true });
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      replies.set(userText, { kind: 'stream', events, gate: (i) => (i === 3 ? held : Promise.resolve()) });
      const key = newKey();
      const first = chat(streamOf(userText), key);
      await eventually(() => (model.requests.some((r) => r.userText === userText) ? true : undefined), 5000);
      // The first answer has started (its frames are being recorded), held at the gate.
      await eventually(async () => ((await streaming(key)) ? true : undefined), 5000, 'the first answer streaming');
      const attached = open(streamOf(userText), key);
      // The duplicate's answer has started while the first is still held: it was attached to the running one.
      await attached.head;
      release();
      const [a, b] = await Promise.all([first, attached.answer]);
      expect(a.status).toBe(200);
      expect(a.text).toBe(events.join(''));
      expect(b.status).toBe(200);
      expect(b.text).toBe(events.join(''));
      expect(b.headers.get('idempotent-replayed')).toBe('true');
      expect(model.requests.filter((r) => r.userText === userText)).toHaveLength(1);

      // And once finished, a replay from the record and its frames, still with no upstream call.
      const replay = await chat(streamOf(userText), key);
      expect(replay.text).toBe(events.join(''));
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(model.requests.filter((r) => r.userText === userText)).toHaveLength(1);
    });

    it('attaches followers of streams on every master at once, each to its own', async () => {
      const runs = Array.from({ length: 9 }, (_, i) => {
        const userText = `many on a cluster ${i} ${randomUUID()}`;
        let release!: () => void;
        const held = new Promise<void>((r) => (release = r));
        const events = completionEvents(`answer number ${i} for its own callers`);
        replies.set(userText, { kind: 'stream', events, gate: (n) => (n === 2 ? held : Promise.resolve()) });
        return { userText, key: newKey(), events, release };
      });
      const firsts = runs.map((r) => chat(streamOf(r.userText), r.key));
      await eventually(
        () => (runs.every((r) => model.requests.some((q) => q.userText === r.userText)) ? true : undefined),
        5000,
      );
      await eventually(
        async () => ((await Promise.all(runs.map((r) => streaming(r.key)))).every(Boolean) ? true : undefined),
        5000,
        'every first answer streaming',
      );
      const attached = runs.map((r) => open(streamOf(r.userText), r.key));
      // Every duplicate's answer has started while the firsts are still held: each was attached to a running one.
      await Promise.all(attached.map((a) => a.head));
      for (const r of runs) r.release();
      const all = await Promise.all([...firsts, ...attached.map((a) => a.answer)]);
      all.forEach((answer, i) => expect(answer.text).toBe(runs[i % runs.length].events.join('')));
      for (const r of runs) expect(model.requests.filter((q) => q.userText === r.userText)).toHaveLength(1);
    });
  });

  it('/health/ready is 200 on the cluster', async () => {
    const ready = await request(api.server).get('/health/ready').expect(200);
    expect(ready.body).toMatchObject({ status: 'ok', info: { redis: { status: 'up' } } });
  });
});
