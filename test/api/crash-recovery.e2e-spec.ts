import { JOBS_STREAM, jobIdFor } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { eventually, freePort, freshRedis, testDatabaseUrl, testRedisUrl } from '../support/infra';
import { TcpProxy } from '../support/tcp-proxy';

/** IDEMPOTENCY_LOCK_TTL_S's default: the apps below run with it. */
const LOCK_TTL_MS = loadApiConfig({}).idempotencyLockTtlMs;

/**
 * An api process dies (SIGKILL: no shutdown hook, no release) while it holds
 * a key. Timeline:
 *   t0        api A's claim runs in Redis: the key is locked for the lock TTL
 *   t0+~20ms  A is killed before the claim's answer reaches it (its link to
 *             Redis is slow), so it never enqueues and never releases
 *   ...       the client retries on api B with the same key: 409, Retry-After
 *   ≤ TTL     the lock expires; the next retry claims the key and runs
 * The guarantee: the key is free within the lock TTL (plus the client's last
 * wait), not a 30 s lock; and the job is queued exactly once.
 */
describe('an api that dies holding a key', () => {
  let redis: Redis;
  let proxy: TcpProxy;
  let dying: AppProcess;
  let healthy: AppProcess;

  beforeAll(async () => {
    redis = await freshRedis();
    // 400 ms each way: a claim's answer takes that long to come back.
    proxy = await TcpProxy.start(freePort(45), testRedisUrl(), { delayMs: 400 });
    const env = { DATABASE_URL: testDatabaseUrl(), API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key}`, LOG_LEVEL: 'warn' };
    [dying, healthy] = await Promise.all([
      startAppProcess('api', freePort(46), { ...env, REDIS_URL: proxy.urlFor(testRedisUrl()) }),
      startAppProcess('api', freePort(47), { ...env, REDIS_URL: testRedisUrl() }),
    ]);
  }, 120_000);
  afterAll(async () => {
    dying?.kill('SIGKILL');
    healthy?.kill('SIGKILL');
    await proxy?.close();
    redis?.disconnect();
  });

  const post = (api: AppProcess, key: string) =>
    fetch(`${api.url}/v1/summaries`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TENANT_A.key}`, 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ text: 'Written once, whoever dies.', notify: 'ops@example.com' }),
    });

  it(`frees the key within the lock TTL (${LOCK_TTL_MS} ms): a retry on another api gets 202, and the job is queued once`, async () => {
    expect(LOCK_TTL_MS).toBeLessThanOrEqual(10_000);
    const key = `crash-${randomUUID()}`;
    const record = `idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`;
    const first = post(dying, key).catch((err: unknown) => err);
    await eventually(
      async () => ((await redis.hget(record, 'state')) === 'running' ? true : undefined),
      5000,
      'the claim',
    );
    dying.kill('SIGKILL');
    expect(await dying.exited).toEqual({ code: null, signal: 'SIGKILL' });
    // The client saw the connection drop, not an answer.
    expect(((await first) as Error).message).toBe('fetch failed');
    // The lock is a lease of the lock TTL, not 30 s.
    const left = await redis.pttl(record);
    expect(left).toBeLessThanOrEqual(LOCK_TTL_MS);

    // The client retries at once: 409, told to come back no later than the lock's expiry.
    const busy = await post(healthy, key);
    expect(busy.status).toBe(409);
    const retryAfter = Number(busy.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter * 1000).toBeLessThanOrEqual(Math.max(1000, (await redis.pttl(record)) + 1000));
    expect(retryAfter).toBeLessThanOrEqual(Math.ceil(LOCK_TTL_MS / 1000) + 1);
    // Refusing the retry left the dead api's lease as it was: not renewed, so it ends when it was due to.
    expect(await redis.pttl(record)).toBeLessThanOrEqual(left);
    // The lease ends: Redis expires the record the dead api never released (its TTL, at most the lock TTL, was
    // checked above), and nothing else frees the key. The retry then claims it and runs.
    await eventually(
      async () => ((await redis.exists(record)) === 0 ? true : undefined),
      LOCK_TTL_MS + 5000,
      'the dead api’s lock to expire',
    );
    const res = await post(healthy, key);
    expect(res.status).toBe(202);

    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    expect(((await res.json()) as { job_id: string }).job_id).toBe(jobId);
    const entries = (await redis.xrange(JOBS_STREAM, '-', '+')).filter(([, f]) => f[f.indexOf('job_id') + 1] === jobId);
    expect(entries).toHaveLength(1);
    expect(await redis.hget(record, 'state')).toBe('completed');
  }, 30_000);
});
