import { IdempotencyProblemTypes } from '@app/idempotency';
import { ProblemTypes } from '@app/problem';
import { type Durability, REDIS_DURABILITY } from '@app/redis';
import { JOBS_STREAM, jobIdFor } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis } from '../support/infra';
import { durableWorkflowClient } from '../support/workflow-client';

/*
 * A 202 only once a replica holds the job and the key's record (INTERFACE.md:
 * a 202 survives the loss of a master). This Redis has no replica, so a
 * durability of one replica can never be met: every write is made on the
 * master and not confirmed, which the api must answer as a 503 that frees the
 * key, never as a 202. (test/cluster has the same against a cluster with
 * replicas, where it is met.)
 */
const NEVER_MET: Durability = { replicas: 1, timeoutMs: 50 };
const body = { text: 'Durable or not at all.', notify: 'ops@example.com' };

describe('POST /v1/summaries when no replica confirms what it wrote', () => {
  let redis: Redis;
  const apis: ApiHarness[] = [];

  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(async () => {
    await Promise.all(apis.map((a) => a.close()));
    redis.disconnect();
  });
  beforeEach(() => redis.flushdb());

  const post = (api: ApiHarness, key: string) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);
  const recordOf = (key: string) => redis.hgetall(`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`);

  it('the job: 503 problem+json saying so, no answer stored, and a retry with the key runs again (same job id)', async () => {
    // Only the queue asks for a replica here: the key's record is written as on one Redis.
    const api = await startApi({ override: durableWorkflowClient(NEVER_MET) });
    apis.push(api);
    const key = `key-${randomUUID()}`;
    const first = await post(api, key).expect(503);
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(first.headers['retry-after']).toBeDefined();
    expect(first.body).toMatchObject({
      type: ProblemTypes.serviceUnavailable,
      title: 'The job could not be queued durably',
    });
    expect(first.body.detail).toMatch(/No replica .* confirmed/);
    expect(await recordOf(key)).toEqual({}); // the key is free
    await post(api, key).expect(503);
    // The master kept each write: two entries, one job id, which the worker runs once (its write is the guard).
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const entries = await redis.xrange(JOBS_STREAM, '-', '+');
    expect(entries.map(([, fields]) => fields[1])).toEqual([jobId, jobId]);
  });

  it("the key's claim: 503 before anything runs, the claim freed, so a retry is not told the key is in progress", async () => {
    const api = await startApi({ override: (b) => b.overrideProvider(REDIS_DURABILITY).useValue(NEVER_MET) });
    apis.push(api);
    const key = `key-${randomUUID()}`;
    const first = await post(api, key).expect(503);
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(first.body).toMatchObject({ type: IdempotencyProblemTypes.storeUnavailable });
    expect(await recordOf(key)).toEqual({});
    expect(await redis.xlen(JOBS_STREAM)).toBe(0); // the handler never ran
    // Not 409 (in progress): the failed claim left nothing behind.
    await post(api, key).expect(503);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });
});
