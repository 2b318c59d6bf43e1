import type { LlmErrorClass } from '../llm/llm.errors';
import { CallTimeoutError } from '../llm/llm.errors';
import { DeadlineExceededError, NonRetryableError, RetriesExhaustedError, RetryCancelledError } from './retry.errors';
import { RetryPolicy } from './retry-policy.service';
import type { RetryPolicyOptions } from './retry-policy.tokens';

/** A clock that only moves when the policy sleeps or a call "takes" time. */
class FakeTime {
  t = 0;
  readonly sleeps: number[] = [];
  now = () => this.t;
  sleep = async (ms: number, signal?: AbortSignal) => {
    if (signal?.aborted) throw signal.reason;
    this.sleeps.push(ms);
    this.t += ms;
  };
}

const defaults: RetryPolicyOptions = {
  maxAttempts: 4,
  callTimeoutMs: 20_000,
  baseDelayMs: 500,
  maxDelayMs: 8000,
  maxRetryAfterMs: 30_000,
  minUsefulAttemptMs: 1000,
};
const retryable: LlmErrorClass = { kind: 'server', retryable: true, status: 503 };
const fatal: LlmErrorClass = { kind: 'client', retryable: false, status: 400 };
class Fail extends Error {
  constructor(readonly cls: LlmErrorClass) {
    super(cls.kind);
  }
}
const classify = (err: unknown): LlmErrorClass =>
  err instanceof Fail ? err.cls : err instanceof CallTimeoutError ? { kind: 'timeout', retryable: true } : { kind: 'unknown', retryable: false };

function setup(options: Partial<RetryPolicyOptions> = {}, random = 0.5) {
  const time = new FakeTime();
  const policy = new RetryPolicy({ ...defaults, ...options }, time, time.sleep, () => random);
  return { time, policy };
}

/** An operation that fails with `failures` in turn, then answers; each call takes `costMs` of fake time. */
function scripted(time: FakeTime, failures: LlmErrorClass[], costMs = 100) {
  const calls: number[] = [];
  const op = async () => {
    calls.push(time.t);
    time.t += costMs;
    const next = failures[calls.length - 1];
    if (next) throw new Fail(next);
    return 'summary';
  };
  return { op, calls };
}

describe('RetryPolicy', () => {
  it('returns the first success with its attempt count', async () => {
    const { time, policy } = setup();
    const { op, calls } = scripted(time, []);
    await expect(policy.run(op, classify, { deadline: 60_000 })).resolves.toEqual({ value: 'summary', attempts: 1 });
    expect(calls).toHaveLength(1);
    expect(time.sleeps).toEqual([]);
  });

  it('retries retryable failures with full-jitter exponential backoff, capped per sleep', async () => {
    const { time, policy } = setup({ maxAttempts: 6, maxDelayMs: 1500 }, 0.5);
    const { op, calls } = scripted(time, [retryable, retryable, retryable, retryable, retryable]);
    await expect(policy.run(op, classify, { deadline: 60_000 })).resolves.toEqual({ value: 'summary', attempts: 6 });
    expect(calls).toHaveLength(6);
    // random 0.5 × min(1500, 500 × 2^n): 250, 500, 750 (cap 1500), 750, 750
    expect(time.sleeps).toEqual([250, 500, 750, 750, 750]);
  });

  it('draws each sleep anywhere from 0 up to the ceiling (full jitter)', async () => {
    for (const [random, expected] of [
      [0, 0],
      [0.999, 499],
    ] as const) {
      const { time, policy } = setup({}, random);
      const { op } = scripted(time, [retryable]);
      await policy.run(op, classify, { deadline: 60_000 });
      expect(time.sleeps).toEqual([expected]);
    }
  });

  it('counts total attempts: maxAttempts calls, then RetriesExhausted (transient)', async () => {
    const { time, policy } = setup({ maxAttempts: 4 });
    const { op, calls } = scripted(time, [retryable, retryable, retryable, retryable, retryable]);
    const err = await policy.run(op, classify, { deadline: 60_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetriesExhaustedError);
    expect(err).toMatchObject({ attempts: 4, transient: true, last: retryable });
    expect(calls).toHaveLength(4);
    expect(time.sleeps).toHaveLength(3);
  });

  it('does not retry what cannot succeed: one call, NonRetryable (permanent)', async () => {
    const { time, policy } = setup();
    const { op, calls } = scripted(time, [fatal]);
    const err = await policy.run(op, classify, { deadline: 60_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NonRetryableError);
    expect(err).toMatchObject({ attempts: 1, transient: false });
    expect(calls).toHaveLength(1);
  });

  it('treats unknown errors as not retryable', async () => {
    const { policy } = setup();
    const err = await policy.run(async () => Promise.reject(new Error('?')), classify, { deadline: 60_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NonRetryableError);
  });

  it('honours Retry-After instead of the backoff, and caps it', async () => {
    const { time, policy } = setup({ maxRetryAfterMs: 5000 });
    const { op } = scripted(time, [
      { kind: 'rate_limited', retryable: true, status: 429, retryAfterMs: 2000 },
      { kind: 'rate_limited', retryable: true, status: 429, retryAfterMs: 60_000 },
    ]);
    await policy.run(op, classify, { deadline: 60_000 });
    expect(time.sleeps).toEqual([2000, 5000]);
  });

  it('stops when the next sleep would leave less than one useful attempt before the deadline', async () => {
    const { time, policy } = setup({ minUsefulAttemptMs: 1000 }, 0.99);
    const { op, calls } = scripted(time, [retryable, retryable, retryable], 3000);
    const err = await policy.run(op, classify, { deadline: 8000 }).catch((e: unknown) => e);
    // t=0 call → 3000, sleep 495 → 3495 call → 6495; the next sleep (990) plus one
    // useful attempt (1000) would end at 8485, past the 8000 deadline: stop now.
    expect(calls).toEqual([0, 3495]);
    expect(time.sleeps).toEqual([495]);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect(err).toMatchObject({ transient: true, attempts: 2 });
  });

  it('gives each attempt min(call timeout, time left) and never starts one that cannot be useful', async () => {
    const { time, policy } = setup({ callTimeoutMs: 5000, minUsefulAttemptMs: 1000 }, 0);
    const limits: number[] = [];
    const op = async (signal: AbortSignal) => {
      limits.push(time.t);
      time.t += 4000;
      void signal;
      throw new Fail(retryable);
    };
    const err = await policy.run(op, classify, { deadline: 9500 }).catch((e: unknown) => e);
    // t=0 call (→4000), sleep 0, t=4000 call (→8000), 1500 left ≥ 1000: t=8000 call (→12000): deadline passed
    expect(limits).toEqual([0, 4000, 8000]);
    expect(err).toBeInstanceOf(DeadlineExceededError);
  });

  it('cuts an attempt started 300 ms before the deadline off at the deadline, not at the call timeout', async () => {
    // The attempt's limit is a real timer: fake timers move it, the fake clock places the deadline.
    jest.useFakeTimers();
    try {
      const { time, policy } = setup({ maxAttempts: 1, callTimeoutMs: 20_000, minUsefulAttemptMs: 100 });
      time.t = 9_700;
      let signal: AbortSignal | undefined;
      const outcome = policy
        .run(
          (s) => {
            signal = s;
            return new Promise<string>(() => undefined); // hangs for ever
          },
          classify,
          { deadline: 10_000 },
        )
        .catch((e: unknown) => e);
      await jest.advanceTimersByTimeAsync(299);
      expect(signal?.aborted).toBe(false);
      await jest.advanceTimersByTimeAsync(1);
      expect(signal?.aborted).toBe(true);
      expect(signal?.reason).toEqual(new CallTimeoutError(300));
      const err = await outcome;
      expect(err).toBeInstanceOf(RetriesExhaustedError);
      expect((err as RetriesExhaustedError).last?.kind).toBe('timeout');
    } finally {
      jest.useRealTimers();
    }
  });

  it('never retries past a deadline that has run out: the error is DeadlineExceeded, not a retry', async () => {
    const { time, policy } = setup();
    time.t = 10_000;
    const err = await policy.run(async () => 'x', classify, { deadline: 10_500 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect(err).toMatchObject({ attempts: 0 });
  });

  it('a stop request ends a backoff sleep at once: RetryCancelled (transient), no further call', async () => {
    const { time, policy } = setup();
    const stop = new AbortController();
    const calls: number[] = [];
    const op = async () => {
      calls.push(time.t);
      stop.abort(new Error('shutdown'));
      throw new Fail(retryable);
    };
    const err = await policy.run(op, classify, { deadline: 60_000, stopRetrying: stop.signal }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetryCancelledError);
    expect(err).toMatchObject({ transient: true, attempts: 1 });
    expect(calls).toHaveLength(1);
  });

  it('cuts off an attempt at its wall-clock limit even when the operation ignores its signal', async () => {
    const policy = new RetryPolicy({ ...defaults, maxAttempts: 2, callTimeoutMs: 50, minUsefulAttemptMs: 10 }, { now: () => performance.now() }, async () => undefined, () => 0);
    let signals = 0;
    const t0 = performance.now();
    const err = await policy
      .run(
        (signal) => {
          signal.addEventListener('abort', () => signals++);
          return new Promise<string>(() => undefined); // hangs for ever
        },
        classify,
        { deadline: performance.now() + 10_000 },
      )
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetriesExhaustedError);
    expect((err as RetriesExhaustedError).last?.kind).toBe('timeout');
    expect(signals).toBe(2);
    expect(performance.now() - t0).toBeLessThan(1000);
  });
});
