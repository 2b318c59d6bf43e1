import {
  CONSUMER_GROUP,
  fieldsOf,
  JOBS_STREAM,
  parseSummaryJob,
  SUMMARY_READY_TOPIC,
  summaryReadyDedupeKey,
} from '@app/summary-queue';
import type { RedisClient } from '@app/redis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freePort, testDataSource, truncateAll } from '../support/infra';
import { pendingIdle } from '../support/pending-entries';
import { describeOnEachRedis } from '../support/redis-backend';
import { startWorker, type WorkerHarness } from '../support/worker-harness';
import { compileRelay, FakeProvider, type RelayHarness } from '../relay/relay-harness';

const ADMIN = { key: 'admin-key-0123456789abcdefghij' };
/** The workers' CLAIM_IDLE_MS in the crash test: how long an entry stays pending before another worker claims it. */
const CLAIM_IDLE_MS = 300;

/**
 * api → stream → worker → summary and outbox row → relay → webhook, with the failures in between, on one Redis and on
 * a Redis Cluster (the relay uses no Redis).
 */
describeOnEachRedis('the whole chain', (backend) => {
  let api: ApiHarness;
  let model: FakeOpenAiServer;
  let provider: FakeProvider;
  let redis: RedisClient;
  let db: DataSource;
  const closers: (() => Promise<void>)[] = [];

  beforeAll(async () => {
    redis = await backend.client();
    db = await testDataSource();
    model = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'Chained.' })).start();
    provider = await FakeProvider.start(freePort(60));
    api = await startApi({ env: { ...backend.env, ADMIN_API_KEY: ADMIN.key } });
  });
  afterAll(async () => {
    await api?.close();
    await provider?.close();
    await model?.stop();
    await db?.destroy();
    redis?.disconnect();
  });
  beforeEach(async () => {
    await backend.flush();
    await truncateAll(db);
    provider.reset();
    model.requests.length = 0;
  });
  afterEach(async () => {
    await Promise.all(closers.splice(0).map((close) => close()));
  });

  const worker = async (env: Record<string, string> = {}): Promise<WorkerHarness> => {
    const w = await startWorker({ modelUrl: model.baseUrl, env: { ...backend.env, ...env } });
    closers.push(() => w.close());
    return w;
  };
  const relay = async (env: Record<string, string> = {}): Promise<RelayHarness> => {
    const r = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url, ...env } });
    closers.push(() => r.close());
    return r;
  };
  /** Until the only pending entry has been idle CLAIM_IDLE_MS by Redis's clock (XPENDING): a worker may claim it. */
  const claimable = () =>
    eventually(
      async () => {
        const idle = [...(await pendingIdle(redis, JOBS_STREAM, CONSUMER_GROUP)).values()];
        return idle.length === 1 && idle[0] >= CLAIM_IDLE_MS ? true : undefined;
      },
      5000,
      `the pending entry idle for ${CLAIM_IDLE_MS} ms`,
    );
  /**
   * Until the row with this dedupe key is due by time (PostgreSQL's clock, the one the claim judges by): its backoff
   * over, no lease on it. Whether it is parked is not looked at.
   */
  const dueByTime = (key: string) =>
    eventually(
      async () => {
        const [row] = await db.query<{ due: boolean }[]>(
          `SELECT next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now()) AS due
             FROM outbox WHERE dedupe_key = $1`,
          [key],
        );
        return row?.due ? true : undefined;
      },
      5000,
      `the outbox row ${key} due by time`,
    );
  const submit = async () =>
    (
      await request(api.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', `key-${randomUUID()}`)
        .send({ text: 'Chain me through every step.', notify: 'reader@example.com' })
        .expect(202)
    ).body.job_id as string;

  it('crash between commit and XACK in the worker, then a relay pass: exactly one webhook delivery', async () => {
    const a = await worker({ CLAIM_IDLE_MS: String(CLAIM_IDLE_MS) });
    const b = await worker({ CLAIM_IDLE_MS: String(CLAIM_IDLE_MS) });
    const r = await relay();
    const jobId = await submit();

    // Worker A reads the entry, runs the job to its commit, and dies before XACK.
    await redis.xgroup('CREATE', JOBS_STREAM, CONSUMER_GROUP, '0', 'MKSTREAM');
    const reply = (await redis.xreadgroup(
      'GROUP',
      CONSUMER_GROUP,
      'worker-a',
      'COUNT',
      1,
      'STREAMS',
      JOBS_STREAM,
      '>',
    )) as [string, [string, string[]][]][];
    const [id, flat] = reply[0][1][0];
    const job = parseSummaryJob({ id, fields: fieldsOf(flat) });
    const never = new AbortController().signal;
    await expect(
      a.handler.handle(job, { deadline: performance.now() + 10_000, stopRetrying: never, signal: never }),
    ).resolves.toBe('done');

    // The relay runs meanwhile, and again after worker B's redelivery.
    await expect(r.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
    await claimable();
    expect(await b.consumer.runOnce()).toEqual([{ id, deliveries: 2, outcome: 'duplicate' }]);
    await expect(r.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });

    expect(model.calls).toBe(1);
    expect([...provider.countsByKey()]).toEqual([[summaryReadyDedupeKey(jobId), 1]]);
    expect(provider.deliveries[0].body).toEqual({
      topic: SUMMARY_READY_TOPIC,
      dedupe_key: summaryReadyDedupeKey(jobId),
      payload: { job_id: jobId, to: 'reader@example.com' },
    });
    expect(Number(((await redis.xpending(JOBS_STREAM, CONSUMER_GROUP)) as [number])[0])).toBe(0);
    const status = await request(api.server)
      .get(`/v1/summaries/${jobId}`)
      .set('Authorization', bearer(TENANT_A))
      .expect(200);
    expect(status.body).toEqual({ job_id: jobId, status: 'done', summary: 'Chained.' });
  });

  it('a parked outbox row re-queued by an operator is sent once', async () => {
    const w = await worker();
    const r = await relay({ OUTBOX_MAX_ATTEMPTS: '2', OUTBOX_BACKOFF_BASE_MS: '1', OUTBOX_BACKOFF_MAX_MS: '1' });
    const jobId = await submit();
    expect((await w.consumer.runOnce()).map((x) => x.outcome)).toEqual(['done']);
    const key = summaryReadyDedupeKey(jobId);

    provider.answer = () => ({ status: 503 });
    await expect(r.relay.runOnce()).resolves.toMatchObject({ failed: 1 });
    // Its backoff (1 ms) is over: the next pass tries it again, and parks it.
    await dueByTime(key);
    await expect(r.relay.runOnce()).resolves.toMatchObject({ parked: 1 });
    // Due by time, as it would be were it not parked: only being parked keeps the next pass from it.
    await dueByTime(key);
    await expect(r.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveriesFor(key)).toHaveLength(2);

    const parked = (
      await request(api.server).get('/admin/outbox/parked').set('Authorization', bearer(ADMIN)).expect(200)
    ).body.parked;
    expect(parked).toEqual([
      expect.objectContaining({ dedupeKey: key, attempts: 2, lastError: expect.stringContaining('503') }),
    ]);
    provider.answer = () => ({ status: 200 });
    await request(api.server)
      .post(`/admin/outbox/${parked[0].id}/requeue`)
      .set('Authorization', bearer(ADMIN))
      .expect(200);

    await expect(r.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
    await expect(r.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveriesFor(key)).toHaveLength(3);
    const [row] = await db.query('SELECT sent_at IS NOT NULL AS sent, parked_at, attempts FROM outbox');
    expect(row).toEqual({ sent: true, parked_at: null, attempts: 0 });
  });
});
