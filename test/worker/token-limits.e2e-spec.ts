import { tokensKey } from '@app/llm';
import { jobIdFor, SummaryJobQueue } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import request from 'supertest';
import { bearer, startApi, TENANT_A } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { type GatewayHarness, startGateway } from '../support/gateway-harness';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { metricValue } from '../support/metrics';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

const TENANT = 'tenant-a';
const INTERNAL_KEY = 'internal-key-0123456789abcdef';

/**
 * A step's model call under its tenant's token limit (TENANT_TOKEN_LIMITS),
 * the summaries job as the step: when the limit has no room, the call waits
 * for the window (within the delivery when it can, else handed back for a
 * later delivery, its count set back) and then runs once; never a failed
 * attempt, never dead-lettered for it. The worker calling the provider itself
 * (it reserves), and through the gateway (the gateway reserves; its 429 is
 * the wait).
 */
describe('workflow steps under tenant token limits', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let worker: WorkerHarness | undefined;
  let gateway: GatewayHarness | undefined;

  const job = () => ({
    jobId: jobIdFor(`${TENANT}:POST:/v1/summaries:${randomUUID()}`),
    tenant: TENANT,
    payload: { text: `limited ${randomUUID()}`, notify: 'a@b.c' },
  });
  const summaries = async (jobId: string) =>
    Number(
      (await db.query<{ n: number }[]>('SELECT count(*)::int AS n FROM summaries WHERE job_id = $1', [jobId]))[0].n,
    );
  /** Fills the tenant's day with settled tokens: nothing fits until the day ends (hours, past any delivery). */
  const fillDay = async () => {
    const [sec] = await redis.time();
    const now = Number(sec) * 1000;
    await redis.hset(tokensKey(TENANT), 'w', now - (now % 86_400_000), 'used', 50_000);
  };
  /** A live reservation of the whole limit that another call holds for `ms` more (its lease): soon free. */
  const holdFor = async (ms: number) => {
    const [sec, us] = await redis.time();
    const now = Number(sec) * 1000 + Math.floor(Number(us) / 1000);
    await redis.hset(
      tokensKey(TENANT),
      'w',
      now - (now % 86_400_000),
      'used',
      0,
      'r:another-call',
      `50000:${now + ms}`,
    );
  };
  const waits = (outcome: string) => metricValue(worker!.app.getHttpServer(), 'worker_token_waits_total', { outcome });

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
  });
  afterAll(async () => {
    await model.stop();
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    model.requests.length = 0;
    model.reply = () => ({ kind: 'complete', content: 'Summed up.' });
  });
  afterEach(async () => {
    await worker?.close();
    worker = undefined;
    await gateway?.close();
    gateway = undefined;
    redis.disconnect();
  });

  it('calling the provider itself: a full window makes the step wait within its delivery, then it runs once', async () => {
    // Another call holds the whole limit for 1.5 s more: this one waits (1 s at a time) within its delivery.
    worker = await startWorker({ modelUrl: model.baseUrl, env: { TENANT_TOKEN_LIMITS: `${TENANT}=50000/1d` } });
    await holdFor(1500);
    const j = job();
    await new SummaryJobQueue(redis).enqueue(j);
    const [result] = await worker.consumer.runOnce();
    expect(result.outcome).toBe('done');
    expect(result.deliveries).toBe(1);
    expect(model.calls).toBe(1);
    expect(await summaries(j.jobId)).toBe(1);
    await expect(waits('waited')).resolves.toBeGreaterThanOrEqual(1);
    await expect(
      metricValue(worker.app.getHttpServer(), 'worker_llm_calls_total', {
        outcome: 'failed',
        error_class: 'tenant_token_limit',
      }),
    ).resolves.toBe(0);
    // Settled to the usage the provider reported (7 + 5); the expired reservation is gone.
    expect(Number(await redis.hget(tokensKey(TENANT), 'used'))).toBe(12);
    expect(await redis.hexists(tokensKey(TENANT), 'r:another-call')).toBe(0);
  });

  it('a window too far off: the delivery is handed back with its count set back, and a later one runs the step once', async () => {
    worker = await startWorker({
      modelUrl: model.baseUrl,
      env: { TENANT_TOKEN_LIMITS: `${TENANT}=50000/1d`, CLAIM_IDLE_MS: '200', MAX_DELIVERIES: '2' },
    });
    await fillDay();
    const j = job();
    await new SummaryJobQueue(redis).enqueue(j);
    // Three hand-backs, more than MAX_DELIVERIES: none counts, so nothing is dead-lettered.
    for (let i = 1; i <= 3; i++) {
      await eventually(
        async () => ((await waits('handed_back')) >= i ? true : (await worker!.consumer.runOnce(), undefined)),
        10_000,
        `hand-back ${i}`,
      );
    }
    expect(model.calls).toBe(0);
    expect(await redis.xlen('{summaries}:dead')).toBe(0);
    // GET /v1/runs/<run_id> shows the wait: the run's step, and until when.
    const api = await startApi();
    try {
      const run = await request(api.server)
        .get(`/v1/runs/${j.jobId}`)
        .set('authorization', bearer(TENANT_A))
        .expect(200);
      // Shown only while `until` is ahead: a time, not checked against the clock here.
      expect(run.body).toMatchObject({
        status: 'queued',
        waiting: { reason: 'token_limit', step: 'summarize', until: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) },
      });
    } finally {
      await api.close();
    }
    // The window frees (an operator raised the limit, or the day turned): the next delivery runs it.
    await redis.del(tokensKey(TENANT));
    await eventually(
      async () => ((await summaries(j.jobId)) === 1 ? true : (await worker!.consumer.runOnce(), undefined)),
      10_000,
      'the summary',
    );
    expect(model.calls).toBe(1);
  });

  it('through the gateway: its 429 tenant_token_limit is the wait, and the call goes upstream once', async () => {
    gateway = await startGateway({ TENANT_TOKEN_LIMITS: `${TENANT}=50000/1d`, INTERNAL_API_KEY: INTERNAL_KEY });
    gateway.replies.set('placeholder', { kind: 'complete', content: 'unused' });
    worker = await startWorker({
      modelUrl: model.baseUrl,
      env: { LLM_GATEWAY_URL: gateway.apiUrl, INTERNAL_API_KEY: INTERNAL_KEY, TENANT_TOKEN_LIMITS: `${TENANT}=1/1s` },
    });
    await holdFor(1500);
    const j = job();
    await new SummaryJobQueue(redis).enqueue(j);
    const [result] = await worker.consumer.runOnce();
    expect(result.outcome).toBe('done');
    expect(await summaries(j.jobId)).toBe(1);
    // One upstream call (the gateway's provider), none refused upstream; the worker waited on the 429.
    expect(gateway.upstreamCalls(j.payload.text)).toHaveLength(1);
    await expect(waits('waited')).resolves.toBeGreaterThanOrEqual(1);
    await expect(
      metricValue(gateway.api.server, 'tenant_token_refusals_total', { tenant: TENANT }),
    ).resolves.toBeGreaterThanOrEqual(1);
  });
});
