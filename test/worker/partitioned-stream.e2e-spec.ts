import { HealthChecksRegistry } from '@app/health';
import { CONSUMER_GROUP, fieldsOf, jobIdFor, partitionOf, SummaryStreams } from '@app/summary-queue';
import type { RedisClient } from '@app/redis';
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { type ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, testDatabaseUrl, testDataSource, truncateAll } from '../support/infra';
import { idlePast } from '../support/pending-entries';
import { metricValue } from '../support/metrics';
import { describeOnEachRedis, mastersOf } from '../support/redis-backend';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

const PARTITIONS = 3;
const CONCURRENCY = 4;
const ADMIN = { key: 'admin-key-0123456789abcdefghij' };
const ROOT = join(__dirname, '..', '..');
const PAYLOAD = '{"text":"Please summarise this.","notify":"ops@example.com"}';

/**
 * JOB_STREAM_PARTITIONS=3, on one Redis and on a Redis Cluster: the api, the worker and the admin tools all see the
 * three partitions. Each partition's keys are read on their own (on a cluster they live on different masters).
 */
describeOnEachRedis('the partitioned job stream (JOB_STREAM_PARTITIONS=3)', (backend) => {
  const streams = new SummaryStreams(PARTITIONS);
  const [p0, p1, p2] = streams.partitions;
  let api: ApiHarness;
  let model: FakeOpenAiServer;
  let redis: RedisClient;
  let db: DataSource;
  const workers: WorkerHarness[] = [];

  const worker = async (env: Record<string, string> = {}, consumer = {}) => {
    const w = await startWorker({
      modelUrl: model.baseUrl,
      env: {
        ...backend.env,
        JOB_STREAM_PARTITIONS: String(PARTITIONS),
        WORKER_CONCURRENCY: String(CONCURRENCY),
        ...env,
      },
      consumer,
    });
    workers.push(w);
    return w;
  };
  /** An Idempotency-Key whose job lands in `partition`. */
  const keyFor = (partition: number): string => {
    for (;;) {
      const key = `key-${randomUUID()}`;
      if (partitionOf(jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`), PARTITIONS) === partition) return key;
    }
  };
  const submit = async (key = `key-${randomUUID()}`) =>
    (
      await request(api.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .send({ text: 'Please summarise this.', notify: 'ops@example.com' })
        .expect(202)
    ).body.job_id as string;
  const status = async (jobId: string) =>
    (await request(api.server).get(`/v1/summaries/${jobId}`).set('Authorization', bearer(TENANT_A)).expect(200)).body;
  const admin = (method: 'get' | 'post', path: string) =>
    request(api.server)[method](path).set('Authorization', bearer(ADMIN));
  const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`))[0].n);
  const jobIdsIn = async (stream: string) =>
    (await redis.xrange(stream, '-', '+')).map(([, flat]) => fieldsOf(flat).job_id);
  const lengths = async (pick: (p: (typeof streams.partitions)[number]) => string) =>
    Promise.all(streams.partitions.map((p) => redis.xlen(pick(p))));
  const cli = (...args: string[]) => {
    const r = spawnSync(process.execPath, [join(ROOT, 'dist', 'apps', 'admin', 'main.js'), ...args], {
      env: {
        PATH: process.env.PATH,
        ...backend.env,
        DATABASE_URL: testDatabaseUrl(),
        JOB_STREAM_PARTITIONS: String(PARTITIONS),
      },
      encoding: 'utf8',
    });
    return { code: r.status, out: r.stdout, err: r.stderr };
  };

  beforeAll(async () => {
    redis = await backend.client();
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
    api = await startApi({
      env: { ...backend.env, ADMIN_API_KEY: ADMIN.key, JOB_STREAM_PARTITIONS: String(PARTITIONS) },
    });
  });
  afterAll(async () => {
    await api?.close();
    await model?.stop();
    await db?.destroy();
    redis?.disconnect();
  });
  beforeEach(async () => {
    await backend.flush();
    await truncateAll(db);
    model.requests.length = 0;
    model.peakConcurrency = 0;
    model.reply = () => ({ kind: 'complete', content: 'Summarised.' });
  });
  afterEach(async () => {
    await Promise.all(workers.splice(0).map((w) => w.close()));
  });

  it('puts each job in the partition its id names; one worker runs them all, never more than its concurrency', async () => {
    const jobIds: string[] = [];
    for (let i = 0; i < 30; i++) jobIds.push(await submit());
    const byPartition = await Promise.all(streams.partitions.map((p) => jobIdsIn(p.jobs)));
    for (const [i, ids] of byPartition.entries()) {
      expect(ids.length).toBeGreaterThan(0);
      for (const id of ids) expect(partitionOf(id, PARTITIONS)).toBe(i);
    }
    expect(byPartition.flat().sort()).toEqual([...jobIds].sort());
    // Each partition's record is under its own tag, where GET reads it.
    for (const id of jobIds) expect(await redis.hget(streams.of(id).jobRecordKey(id), 'tenant')).toBe(TENANT_A.tenant);
    expect(await status(jobIds[0])).toEqual({ job_id: jobIds[0], status: 'queued' });
    const stats = (await admin('get', '/admin/stats').expect(200)).body.queue;
    expect(stats).toEqual({
      length: 30,
      pending: 0,
      deadLetters: 0,
      partitions: byPartition.map((ids, partition) => ({ partition, length: ids.length, pending: 0, deadLetters: 0 })),
    });

    model.reply = () => ({ kind: 'complete', content: 'Summarised.', delayMs: 40 });
    const w = await worker({}, { blockMs: 200 });
    w.consumer.start();
    await eventually(async () => ((await count('summaries')) === 30 ? true : undefined), 20_000, '30 summaries');
    expect(await count('outbox')).toBe(30);
    await eventually(async () => ((await lengths((p) => p.jobs)).every((n) => n === 0) ? true : undefined));
    expect(model.calls).toBe(30);
    // All partitions together, never more than WORKER_CONCURRENCY model calls at once; and they did overlap.
    expect(model.peakConcurrency).toBeLessThanOrEqual(CONCURRENCY);
    expect(model.peakConcurrency).toBeGreaterThan(1);
    for (const p of streams.partitions)
      expect(Number(((await redis.xpending(p.jobs, CONSUMER_GROUP)) as [number])[0])).toBe(0);
    expect(await status(jobIds[0])).toEqual({ job_id: jobIds[0], status: 'done', summary: 'Summarised.' });
    // Every partition's loop is watched by liveness: each is registered, and would be reported once silent.
    const loops = w.app
      .get(HealthChecksRegistry)
      .staleLoops(performance.now() + 3_600_000)
      .map((l) => l.name);
    expect(loops).toEqual(expect.arrayContaining(['streams-consumer:0', 'streams-consumer:1', 'streams-consumer:2']));
    // The queue gauges: in total, and by partition.
    const server = w.app.getHttpServer();
    expect(await metricValue(server, 'jobs_stream_length')).toBe(0);
    await w.consumer.stop();
    await submit(keyFor(2));
    expect(await metricValue(server, 'jobs_stream_length')).toBe(1);
    expect(await metricValue(server, 'jobs_stream_partition_length', { partition: '2' })).toBe(1);
    expect(await metricValue(server, 'jobs_stream_partition_length', { partition: '0' })).toBe(0);
  });

  it('reclaims an entry a dead consumer left pending in partition 2', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '100' });
    const jobId = await submit(keyFor(2));
    expect(await jobIdsIn(p2.jobs)).toEqual([jobId]);
    await redis.xgroup('CREATE', p2.jobs, CONSUMER_GROUP, '0', 'MKSTREAM');
    // Delivered to a consumer that then dies: pending, never acknowledged.
    await redis.xreadgroup('GROUP', CONSUMER_GROUP, 'dead-consumer', 'COUNT', 10, 'STREAMS', p2.jobs, '>');
    // Idle past CLAIM_IDLE_MS, by XPENDING's own idle time: claimable.
    await idlePast(redis, p2.jobs, CONSUMER_GROUP, 100);
    expect(await w.consumer.runOnce()).toEqual([expect.objectContaining({ deliveries: 2, outcome: 'done' })]);
    expect(await db.query('SELECT job_id FROM summaries')).toEqual([{ job_id: jobId }]);
    expect(await count('outbox')).toBe(1);
    expect(await redis.xlen(p2.jobs)).toBe(0);
    expect(Number(((await redis.xpending(p2.jobs, CONSUMER_GROUP)) as [number])[0])).toBe(0);
  });

  it("keeps a long job in partition 2 its own: its lease is refreshed in partition 2's stream", async () => {
    // Refreshed every third of CLAIM_IDLE_MS (1 s). The model holds the job
    // until the test has seen four refreshes (each resets the entry's idle
    // time in Redis): pending longer than CLAIM_IDLE_MS, never idle that long.
    // The bound is Redis's own: another worker tries to reclaim at every poll,
    // so an entry left idle past CLAIM_IDLE_MS would be taken, and the test fail.
    const [a, b] = [await worker({ CLAIM_IDLE_MS: '3000' }), await worker({ CLAIM_IDLE_MS: '3000' })];
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    model.reply = async () => {
      await held;
      return { kind: 'complete', content: 'Slow but sure.' };
    };
    const jobId = await submit(keyFor(2));
    const running = a.consumer.runOnce();
    await eventually(() => (model.calls === 1 ? true : undefined), 5000, 'the model call');
    const entry = async () =>
      ((await redis.xpending(p2.jobs, CONSUMER_GROUP, '-', '+', 10)) as [string, string, number][])[0];
    let refreshes = 0;
    let lastIdle = (await entry())[2];
    await eventually(
      async () => {
        expect(await b.consumer.runOnce()).toEqual([]);
        const [, owner, idleMs] = await entry();
        expect(owner).toBe(a.consumer.consumerName);
        if (idleMs < lastIdle) refreshes++;
        lastIdle = idleMs;
        return refreshes >= 4 ? true : undefined;
      },
      20_000,
      'four lease refreshes',
    );
    // Another worker finds nothing to reclaim: the job is alive.
    expect(await b.consumer.runOnce()).toEqual([]);
    release();
    expect(await running).toEqual([expect.objectContaining({ deliveries: 1, outcome: 'done' })]);
    expect(model.calls).toBe(1);
    expect(await db.query('SELECT job_id FROM summaries')).toEqual([{ job_id: jobId }]);
  });

  it('dead-letters a poison job in partition 1 there, marks it failed, and re-drives it into partition 1', async () => {
    const w = await worker();
    model.reply = () => ({ kind: 'error', status: 400 });
    const jobId = await submit(keyFor(1));
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(await lengths((p) => p.dead)).toEqual([0, 1, 0]);
    expect(await redis.hget(p1.jobRecordKey(jobId), 'status')).toBe('failed');
    expect(await status(jobId)).toEqual({ job_id: jobId, status: 'failed', error: 'llm_client' });

    const [streamId] = (await redis.xrange(p1.dead, '-', '+')).map(([id]) => id);
    const listed = (await admin('get', '/admin/dead-letters').expect(200)).body.dead_letters;
    expect(listed).toEqual([
      expect.objectContaining({ id: `1:${streamId}`, partition: 1, jobId, reason: 'llm_client' }),
    ]);
    expect((await admin('get', '/admin/stats').expect(200)).body.queue).toMatchObject({
      deadLetters: 1,
      partitions: [
        { partition: 0, length: 0, pending: 0, deadLetters: 0 },
        { partition: 1, length: 0, pending: 0, deadLetters: 1 },
        { partition: 2, length: 0, pending: 0, deadLetters: 0 },
      ],
    });

    // Ids that name no partition: 404; ids that cannot be ids: 400. Nothing changes.
    const unknown = await admin('post', `/admin/dead-letters/7:${streamId}/redrive`).expect(404);
    expect(unknown.body).toMatchObject({ title: 'No such job stream partition' });
    expect(unknown.body.detail).toContain('JOB_STREAM_PARTITIONS is 3');
    const plain = await admin('post', `/admin/dead-letters/${streamId}/redrive`).expect(404);
    expect(plain.body.detail).toContain('<partition>:<ms>-<seq>');
    await admin('get', `/admin/dead-letters?after=9:${streamId}`).expect(404);
    for (const bad of [`x:${streamId}`, `01:${streamId}`, `1:${streamId}:0`, '1:1764460800000'])
      await admin('post', `/admin/dead-letters/${encodeURIComponent(bad)}/redrive`).expect(400);
    await admin('post', `/admin/dead-letters/0:${streamId}/redrive`).expect(404); // no such dead letter there
    expect(await redis.xlen(p1.dead)).toBe(1);

    const before = await metricValue(api.server, 'admin_actions_total', { action: 'redrive' });
    const redriven = (await admin('post', `/admin/dead-letters/1:${streamId}/redrive`).expect(200)).body;
    expect(redriven).toMatchObject({ dead_letter: `1:${streamId}`, job_id: jobId });
    expect(await lengths((p) => p.dead)).toEqual([0, 0, 0]);
    expect(await jobIdsIn(p1.jobs)).toEqual([jobId]);
    expect(await lengths((p) => p.jobs)).toEqual([0, 1, 0]);
    expect(await status(jobId)).toEqual({ job_id: jobId, status: 'queued' });
    // Counted in partition 1's own counter, summed on the api's /metrics.
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(before + 1);
    expect(await redis.hget(p1.adminActions, 'redrive')).toBe('1');

    model.reply = () => ({ kind: 'complete', content: 'Second time lucky.' });
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect(await status(jobId)).toEqual({ job_id: jobId, status: 'done', summary: 'Second time lucky.' });
  });

  describe('dead letters of every partition, as one list', () => {
    /** Dead letters with chosen ids, so the order across partitions is known: [partition, stream id]. */
    const letters: [number, string][] = [
      [0, '5-0'],
      [0, '10-0'],
      [1, '5-0'],
      [1, '7-0'],
      [2, '6-0'],
    ];
    const oldestFirst = ['0:5-0', '1:5-0', '2:6-0', '1:7-0', '0:10-0'];
    beforeEach(async () => {
      for (const [partition, id] of letters) {
        const jobId = randomUUID();
        await redis.xadd(
          streams.partitions[partition].dead,
          id,
          'job_id',
          jobId,
          'tenant',
          TENANT_A.tenant,
          'payload',
          PAYLOAD,
          'reason',
          'llm_client',
          'source_id',
          '1-0',
        );
      }
    });

    it('the admin API lists them oldest first across partitions, and its cursor pages across them', async () => {
      const list = async (query: string) =>
        ((await admin('get', `/admin/dead-letters${query}`).expect(200)).body.dead_letters as { id: string }[]).map(
          (l) => l.id,
        );
      expect(await list('')).toEqual(oldestFirst);
      expect(await list('?count=2')).toEqual(oldestFirst.slice(0, 2));
      expect(await list('?count=2&after=1:5-0')).toEqual(oldestFirst.slice(2, 4));
      expect(await list('?count=2&after=1:7-0')).toEqual(oldestFirst.slice(4));
      expect(await list('?after=0:10-0')).toEqual([]);
      // A cursor between entries: what comes after it in the order, ties going by partition.
      expect(await list('?after=1:6-0')).toEqual(['2:6-0', '1:7-0', '0:10-0']);
      expect(await list('?after=2:18446744073709551615-18446744073709551615')).toEqual([]);
      const all = (await admin('post', '/admin/dead-letters/redrive?limit=3').expect(200)).body;
      expect(all).toEqual({ redriven: 3, notRedrivable: [], next: '2:6-0' });
      expect((await admin('post', `/admin/dead-letters/redrive?after=${all.next}`).expect(200)).body).toEqual({
        redriven: 2,
        notRedrivable: [],
      });
      expect(await lengths((p) => p.jobs)).toEqual([2, 2, 1]);
      expect(await lengths((p) => p.dead)).toEqual([0, 0, 0]);
    });

    it('the admin CLI lists, counts and re-drives them in every partition', async () => {
      const list = cli('dead-letters', 'list');
      expect(list.code).toBe(0);
      expect(JSON.parse(list.out).dead_letters.map((l: { id: string }) => l.id)).toEqual(oldestFirst);
      const paged = cli('dead-letters', 'list', '--count', '2', '--after', '1:5-0');
      expect(JSON.parse(paged.out).dead_letters.map((l: { id: string }) => l.id)).toEqual(oldestFirst.slice(2, 4));
      expect(JSON.parse(cli('stats').out).queue).toMatchObject({
        deadLetters: 5,
        partitions: [
          { partition: 0, deadLetters: 2 },
          { partition: 1, deadLetters: 2 },
          { partition: 2, deadLetters: 1 },
        ],
      });
      const one = cli('dead-letters', 'redrive', '2:6-0');
      expect(one.code).toBe(0);
      expect(await lengths((p) => p.jobs)).toEqual([0, 0, 1]);
      const unknown = cli('dead-letters', 'redrive', '5:6-0');
      expect(unknown.code).toBe(1);
      expect(unknown.err).toContain('no partition 5');
      const all = cli('dead-letters', 'redrive', '--all');
      expect(all.code).toBe(0);
      expect(JSON.parse(all.out)).toEqual({ redriven: 4, notRedrivable: [] });
      expect(await lengths((p) => p.jobs)).toEqual([2, 2, 1]);
      expect(await lengths((p) => p.dead)).toEqual([0, 0, 0]);
      expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBeGreaterThanOrEqual(5);
    });
  });

  it('on shutdown, ends the blocked read of every partition at once', async () => {
    // Blocked for ten minutes: only the stop itself can end these reads within the test's time.
    const w = await worker({}, { blockMs: 600_000 });
    w.consumer.start();
    // Each partition's loop blocks in XREADGROUP on a connection of its own, on its partition's master.
    const blocked = async () =>
      (await Promise.all(mastersOf(redis).map((node) => node.client('LIST'))))
        .flatMap((list) => String(list).split('\n'))
        .filter((line) => line.includes(`name=${w.consumer.consumerName}:blocking:`) && line.includes('cmd=xread'));
    await eventually(async () => ((await blocked()).length === PARTITIONS ? true : undefined), 5000, 'three reads');
    await w.consumer.stop();
    await eventually(async () => ((await blocked()).length === 0 ? true : undefined), 2000, 'no blocked read left');
    // Nothing was pending: the consumer left every partition's group.
    for (const p of [p0, p1, p2]) expect(await redis.xinfo('CONSUMERS', p.jobs, CONSUMER_GROUP)).toEqual([]);
  });
});
