import { JOBS_STREAM, jobIdFor } from '@app/summary-queue';
import { ProblemTypes } from '@app/problem';
import { REDIS_DURABILITY } from '@app/redis';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis } from '../support/infra';

/*
 * A 202 only once a replica holds the job (INTERFACE.md: a 202 survives the
 * loss of a master). This Redis has no replica, so a durability of one
 * replica can never be met: every enqueue is written on the master and not
 * confirmed, which the api must answer as a 503 that frees the key, never
 * as a 202. (test/cluster has the same against a cluster with replicas.)
 */
describe('POST /v1/summaries when no replica confirms the job', () => {
  let api: ApiHarness;
  let redis: Redis;
  const body = { text: 'Durable or not at all.', notify: 'ops@example.com' };

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi({
      override: (b) => b.overrideProvider(REDIS_DURABILITY).useValue({ replicas: 1, timeoutMs: 50 }),
    });
  });
  afterAll(async () => {
    await api.close();
    redis.disconnect();
  });
  beforeEach(() => redis.flushdb());

  const post = (key: string) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);

  it('answers 503 problem+json saying so, stores no answer, and a retry with the key runs again (same job id)', async () => {
    const key = `key-${randomUUID()}`;
    const first = await post(key).expect(503);
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(first.headers['retry-after']).toBeDefined();
    expect(first.body).toMatchObject({
      type: ProblemTypes.serviceUnavailable,
      title: 'The job could not be queued durably',
    });
    expect(first.body.detail).toMatch(/No replica .* confirmed/);
    // The key is free: no answer stored for it.
    expect(await redis.hget(`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`, 'state')).toBeNull();
    await post(key).expect(503);
    // The master kept each write: two entries, one job id, which the worker runs once (its write is the guard).
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const entries = await redis.xrange(JOBS_STREAM, '-', '+');
    expect(entries.map(([, fields]) => fields[1])).toEqual([jobId, jobId]);
  });
});
