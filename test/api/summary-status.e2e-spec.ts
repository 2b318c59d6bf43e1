import { jobRecordKey } from '@app/summary-queue';
import { ProblemTypes } from '@app/problem';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freePort, freshRedis, startRedisServer, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

describe('GET /v1/summaries/:job_id, with the worker behind it', () => {
  let api: ApiHarness;
  let worker: WorkerHarness;
  let model: FakeOpenAiServer;
  let redis: Redis;
  let db: DataSource;

  beforeAll(async () => {
    redis = await freshRedis();
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
    api = await startApi();
    worker = await startWorker({ modelUrl: model.baseUrl });
  });
  afterAll(async () => {
    await worker.close();
    await api.close();
    await model.stop();
    await db.destroy();
    redis.disconnect();
  });
  beforeEach(async () => {
    await truncateAll(db);
    model.reply = () => ({ kind: 'complete', content: 'The fox jumped.' });
  });

  const submit = async (tenant: { key: string } = TENANT_A) => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(tenant))
      .set('Idempotency-Key', `key-${randomUUID()}`)
      .send({ text: 'The quick brown fox jumps over the lazy dog.', notify: 'reader@example.com' })
      .expect(202);
    return res.body.job_id as string;
  };
  const status = (jobId: string, tenant: { key: string } = TENANT_A) =>
    request(api.server).get(`/v1/summaries/${jobId}`).set('Authorization', bearer(tenant));

  it('queued, then done with the summary once the worker has run', async () => {
    const jobId = await submit();
    expect((await status(jobId).expect(200)).body).toEqual({ job_id: jobId, status: 'queued' });
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect((await status(jobId).expect(200)).body).toEqual({
      job_id: jobId,
      status: 'done',
      summary: 'The fox jumped.',
    });
    expect(model.calls).toBeGreaterThanOrEqual(1);
  });

  it('failed with the reason once the worker dead-lettered it', async () => {
    model.reply = () => ({ kind: 'error', status: 400 });
    const jobId = await submit();
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect((await status(jobId).expect(200)).body).toEqual({ job_id: jobId, status: 'failed', error: 'llm_client' });
  });

  it("404 for another tenant's job, in every state", async () => {
    const queued = await submit(TENANT_A);
    const res = await status(queued, TENANT_B).expect(404);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body.type).toBe(ProblemTypes.notFound);
    await worker.consumer.runOnce();
    await status(queued, TENANT_B).expect(404);
    await status(queued, TENANT_A).expect(200);
  });

  it('404 for an unknown job id and for something that is not a job id', async () => {
    await status(randomUUID()).expect(404);
    await status('not-a-uuid').expect(404);
    await status("1' OR '1'='1").expect(404);
  });

  it('401 without an API key', async () => {
    await request(api.server).get(`/v1/summaries/${randomUUID()}`).expect(401);
  });

  it('done even after the job record has expired from Redis', async () => {
    const jobId = await submit();
    await worker.consumer.runOnce();
    await redis.del(jobRecordKey(jobId));
    expect((await status(jobId).expect(200)).body.status).toBe('done');
  });

  it('done from PostgreSQL while Redis is down; what only Redis knows is a 503, not a guess', async () => {
    const jobId = await submit();
    await worker.consumer.runOnce();
    const server = await startRedisServer(freePort(4));
    const lonely = await startApi({ env: { REDIS_URL: server.url } });
    try {
      await server.stop();
      const done = await request(lonely.server)
        .get(`/v1/summaries/${jobId}`)
        .set('Authorization', bearer(TENANT_A))
        .expect(200);
      expect(done.body).toEqual({ job_id: jobId, status: 'done', summary: 'The fox jumped.' });
      const unknown = await request(lonely.server)
        .get(`/v1/summaries/${randomUUID()}`)
        .set('Authorization', bearer(TENANT_A))
        .expect(503);
      expect(unknown.body.type).toBe(ProblemTypes.serviceUnavailable);
      expect(unknown.headers['retry-after']).toBe('1');
    } finally {
      await lonely.close();
      await server.stop();
    }
  });
});
