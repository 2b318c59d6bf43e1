import { IdempotencyStore, RedisIdempotencyStore } from '@app/idempotency';
import { LockLease } from '@app/idempotency/lock-lease';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { freshRedis } from '../support/infra';

/** One renewal as the store saw it: when (on the lease's clock) and what came of it. */
interface Renewal {
  readonly at: number;
  readonly result: 'error' | boolean;
}

describe('LockLease on Redis', () => {
  let redis: Redis;
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());
  afterEach(() => jest.useRealTimers());

  it('one failed renewal does not lose the lock: the retry comes an eighth of the TTL later, inside the TTL', async () => {
    // The lease's clock is jest's, moved step by step: a busy machine cannot
    // push one step past another (this test once failed on a 67 ms margin of
    // real time). Redis answers every renewal for real; the test waits for
    // each answer before it moves the clock on.
    jest.useFakeTimers({ doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'], now: 0 });
    const real = new RedisIdempotencyStore(redis);
    const renewals: Renewal[] = [];
    /** When each renewal was sent: checked before its answer is awaited, so one that never comes fails at once. */
    const sent: number[] = [];
    const answered: (() => void)[] = [];
    const renewalAnswered = (n: number) => new Promise<void>((resolve) => (answered[n - 1] = resolve));
    const seen = (renewal: Renewal) => {
      renewals.push(renewal);
      answered[renewals.length - 1]?.();
    };
    // The real store, with one blip: the first renewal times out 1.5 s after it was sent.
    const store: IdempotencyStore = {
      claim: real.claim.bind(real),
      complete: real.complete.bind(real),
      release: real.release.bind(real),
      renew: async (...args) => {
        const at = Date.now();
        sent.push(at);
        if (renewals.length === 0) {
          await new Promise((r) => setTimeout(r, 1500));
          seen({ at, result: 'error' });
          throw new Error('Command timed out');
        }
        const ours = await real.renew(...args);
        seen({ at, result: ours });
        return ours;
      },
    };
    const key = `tenant:POST:/lease:${randomUUID()}`;
    // Long enough on the real clock (Redis's) for the few commands between a renewal and the test's look at it, on
    // a loaded machine: the lease's schedule is on the fake clock, which costs no time.
    const ttlMs = 4000;
    expect(await real.claim(key, 'ours', 'fp', ttlMs)).toEqual({ outcome: 'claimed' });
    const lost: string[] = [];
    const errors: unknown[] = [];
    // Claimed at 0, so the lock expires at 4000 unless renewed. Renewal is due
    // at 1333 (a third of the TTL) and fails at 2833. Waiting another third
    // would try at 4166, too late; the retry after an error comes an eighth
    // later, at 3333.
    const lease = new LockLease(
      store,
      key,
      'ours',
      ttlMs,
      () => lost.push('lost'),
      (err) => errors.push(err),
    );
    // What Redis holds says which renewals took: the record's expiry is pushed far out before each one, so only a
    // renewal that worked brings it back within the TTL.
    const record = `idem:${key}`;
    const FAR = 60_000;
    const pushedOut = async () => expect(await redis.pexpire(record, FAR)).toBe(1);
    const renewedInRedis = async () => {
      const pttl = await redis.pttl(record);
      expect(pttl).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(ttlMs);
    };
    try {
      await pushedOut();
      const first = renewalAnswered(1);
      await jest.advanceTimersByTimeAsync(1333 + 1500);
      expect(sent).toEqual([1333]);
      await first;
      expect(errors).toHaveLength(1);
      // The failed renewal changed nothing.
      expect(await redis.pttl(record)).toBeGreaterThan(ttlMs);

      const retry = renewalAnswered(2);
      await jest.advanceTimersByTimeAsync(500);
      expect(sent).toEqual([1333, 3333]);
      await retry;
      expect(renewals).toEqual([
        { at: 1333, result: 'error' },
        { at: 3333, result: true },
      ]);
      expect(renewals[1].at).toBeLessThan(ttlMs);
      await renewedInRedis();

      // Back to a third of the TTL after a renewal that worked: 4666, inside the 7333 it bought.
      await pushedOut();
      const next = renewalAnswered(3);
      await jest.advanceTimersByTimeAsync(1333);
      expect(sent).toEqual([1333, 3333, 4666]);
      await next;
      expect(renewals[2]).toEqual({ at: 4666, result: true });
      await renewedInRedis();

      expect(errors).toHaveLength(1);
      expect(lost).toEqual([]);
      expect(lease.lost).toBe(false);
      expect(await redis.hget(`idem:${key}`, 'token')).toBe('ours');
    } finally {
      lease.stop();
    }
  });
});
