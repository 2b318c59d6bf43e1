import { IdempotencyStore, RedisIdempotencyStore } from '@app/idempotency';
import { LockLease } from '@app/idempotency/lock-lease';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { freshRedis, sleep } from '../support/infra';

describe('LockLease on Redis', () => {
  let redis: Redis;
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  it('one failed renewal does not lose the lock: the next try comes well before it expires', async () => {
    const real = new RedisIdempotencyStore(redis);
    let renewals = 0;
    // The real store, with one blip: the first renewal times out after 150 ms.
    const store: IdempotencyStore = {
      claim: real.claim.bind(real),
      complete: real.complete.bind(real),
      release: real.release.bind(real),
      renew: async (...args) => {
        renewals += 1;
        if (renewals === 1) {
          await sleep(150);
          throw new Error('Command timed out');
        }
        return real.renew(...args);
      },
    };
    const key = `tenant:POST:/lease:${randomUUID()}`;
    const ttlMs = 400;
    expect(await real.claim(key, 'ours', 'fp', ttlMs)).toEqual({ outcome: 'claimed' });
    const lost: string[] = [];
    const errors: unknown[] = [];
    // Renewal is due at 133 ms (a third of the TTL) and fails at 283 ms; the
    // lock expires at 400 ms. Waiting another third would try at 416 ms, too
    // late; the retry after an error comes 50 ms later (an eighth).
    const lease = new LockLease(
      store,
      key,
      'ours',
      ttlMs,
      () => lost.push('lost'),
      (err) => errors.push(err),
    );
    try {
      await sleep(1000);
      expect(errors).toHaveLength(1);
      expect(lost).toEqual([]);
      expect(lease.lost).toBe(false);
      expect(await redis.hget(`idem:${key}`, 'token')).toBe('ours');
    } finally {
      lease.stop();
    }
  });
});
