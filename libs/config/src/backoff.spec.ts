import { backoffDelay, type Backoff } from './backoff';

/**
 * The three backoffs backoffDelay replaced, verbatim, so the table below keeps
 * proving that every caller waits exactly what it waited before.
 */
const before = {
  /** libs/workflows/src/retry/backoff.ts: backoffDelay(retry, { baseMs, capMs }, random?). */
  worker(retry: number, { baseMs, capMs }: { baseMs: number; capMs: number }, random?: () => number): number {
    const step = Math.min(capMs, baseMs * 2 ** Math.max(0, retry));
    return random ? Math.floor(random() * step) : step;
  },
  /** apps/relay/src/outbox/backoff.ts: retryDelayMs(failures, baseMs, capMs, random). */
  relay(failures: number, baseMs: number, capMs: number, random: () => number = Math.random): number {
    const exponent = Math.min(Math.max(failures - 1, 0), 40);
    const step = Math.min(capMs, baseMs * 2 ** exponent);
    return Math.round(step / 2 + random() * (step / 2));
  },
  /** libs/redis/src/create-redis-client.ts: the retryStrategy. */
  redis: (times: number): number => Math.min(50 * 2 ** times, 2000),
};

/** A small seeded generator (mulberry32), so the table is the same on every run. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const next = seeded(11);
/** The edges of [0, 1), 1 itself (tests pass it), and 500 seeded draws. */
const randoms = [0, Number.EPSILON, 1e-9, 0.1, 0.25, 1 / 3, 0.5, 0.7, 0.999999, 1 - 2 ** -53, 1].concat(
  Array.from({ length: 500 }, next),
);
const counts = [...Array.from({ length: 70 }, (_, i) => i - 2), 100, 1023, 1024, 1100, 5000, 100_000];
const constant = (r: number) => () => r;

describe('backoffDelay: the same waits as the three it replaced', () => {
  it('the relay (equal jitter): every failure count and random value, for its rows and its reconnect', () => {
    // Defaults of OUTBOX_BACKOFF_BASE_MS / _MAX_MS, the listener's reconnect, and the config's bounds.
    const params: [number, number][] = [
      [1000, 300_000],
      [100, 5000],
      [1, 1],
      [1, 86_400_000],
      [3_600_000, 86_400_000],
    ];
    for (const [baseMs, capMs] of params) {
      const backoff: Backoff = { baseMs, capMs, jitter: 'equal' };
      for (const failures of counts) {
        const now = randoms.map((r) => backoffDelay(failures - 1, backoff, constant(r)));
        const then = randoms.map((r) => before.relay(failures, baseMs, capMs, constant(r)));
        expect({ baseMs, capMs, failures, waits: now }).toEqual({ baseMs, capMs, failures, waits: then });
      }
    }
  });

  it('redis (no jitter): every reconnect attempt', () => {
    const backoff: Backoff = { baseMs: 50, capMs: 2000, jitter: 'none' };
    // ioredis counts `times` from 1; 0 is included for good measure.
    const times = counts.filter((t) => t >= 0);
    expect(times.map((t) => backoffDelay(t, backoff))).toEqual(times.map((t) => before.redis(t)));
    expect([1, 2, 3, 4, 5, 6].map((t) => backoffDelay(t, backoff))).toEqual([100, 200, 400, 800, 1600, 2000]);
  });

  it('the worker: full jitter for its retry policy, none for the consumer loop', () => {
    const params: [number, number][] = [
      [500, 8000], // WorkerModule's retry policy
      [100, 5000], // the consumer's turn backoff
    ];
    for (const [baseMs, capMs] of params) {
      for (const retry of counts) {
        const full = randoms.map((r) => backoffDelay(retry, { baseMs, capMs, jitter: 'full' }, constant(r)));
        const fullThen = randoms.map((r) => before.worker(retry, { baseMs, capMs }, constant(r)));
        expect({ baseMs, capMs, retry, waits: full }).toEqual({ baseMs, capMs, retry, waits: fullThen });
        expect(backoffDelay(retry, { baseMs, capMs, jitter: 'none' })).toBe(before.worker(retry, { baseMs, capMs }));
      }
    }
  });
});

describe('backoffDelay', () => {
  const none: Backoff = { baseMs: 100, capMs: 5000, jitter: 'none' };
  const full: Backoff = { ...none, jitter: 'full' };
  const equal: Backoff = { ...none, jitter: 'equal' };

  it('without jitter is the capped exponential step itself, and draws nothing', () => {
    const random = jest.fn(() => 0.5);
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((retry) => backoffDelay(retry, none, random))).toEqual([
      100, 200, 400, 800, 1600, 3200, 5000, 5000,
    ]);
    expect(random).not.toHaveBeenCalled();
  });

  it('with full jitter draws anywhere in [0, step)', () => {
    expect(backoffDelay(3, full, () => 0)).toBe(0);
    expect(backoffDelay(3, full, () => 0.5)).toBe(400);
    expect(backoffDelay(3, full, () => 0.999999)).toBe(799);
    expect(backoffDelay(10, full, () => 0.999999)).toBe(4999);
  });

  it('with equal jitter keeps half the step and draws the other half', () => {
    expect([0, 1, 2, 3].map((retry) => backoffDelay(retry, equal, () => 0))).toEqual([50, 100, 200, 400]);
    expect([0, 1, 2, 3].map((retry) => backoffDelay(retry, equal, () => 0.5))).toEqual([75, 150, 300, 600]);
    expect([0, 1, 2, 3].map((retry) => backoffDelay(retry, equal, () => 1))).toEqual([100, 200, 400, 800]);
  });

  it('stays at the cap however long it has been failing, and treats a negative count as the first retry', () => {
    expect(backoffDelay(5000, none)).toBe(5000);
    expect(backoffDelay(5000, equal, () => 0)).toBe(2500);
    expect(backoffDelay(-1, none)).toBe(100);
    expect(backoffDelay(2000, { baseMs: 0, capMs: 5000, jitter: 'none' })).toBe(0); // not NaN
  });
});
