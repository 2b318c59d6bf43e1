import { getEventListeners, setMaxListeners } from 'node:events';
import { CallTimeoutError, type LlmErrorClass } from '@app/llm';
import { DeadlineExceededError, NonRetryableError, RetriesExhaustedError, RetryCancelledError } from './retry.errors';
import { RetryPolicy } from './retry-policy.service';
import { realSleep, type RetryPolicyOptions, type Sleep } from './retry-policy.tokens';

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
  err instanceof Fail
    ? err.cls
    : err instanceof CallTimeoutError
      ? { kind: 'timeout', retryable: true }
      : { kind: 'unknown', retryable: false };

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
    const err = await policy
      .run(async () => Promise.reject(new Error('?')), classify, { deadline: 60_000 })
      .catch((e: unknown) => e);
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
    const err = await policy
      .run(op, classify, { deadline: 60_000, stopRetrying: stop.signal })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetryCancelledError);
    expect(err).toMatchObject({ transient: true, attempts: 1 });
    expect(calls).toHaveLength(1);
  });

  it('cuts off an attempt at its wall-clock limit even when the operation ignores its signal', async () => {
    // The limit is a real timer: fake timers move it, so "at 50 ms, not at the deadline" is exact.
    jest.useFakeTimers();
    try {
      const policy = new RetryPolicy(
        { ...defaults, maxAttempts: 2, callTimeoutMs: 50, minUsefulAttemptMs: 10 },
        { now: () => 0 },
        async () => undefined,
        () => 0,
      );
      let signals = 0;
      let settled = false;
      const outcome = policy
        .run(
          (signal) => {
            signal.addEventListener('abort', () => signals++);
            return new Promise<string>(() => undefined); // hangs for ever
          },
          classify,
          { deadline: 10_000 },
        )
        .catch((e: unknown) => e)
        .finally(() => (settled = true));
      await jest.advanceTimersByTimeAsync(49);
      expect(signals).toBe(0);
      await jest.advanceTimersByTimeAsync(1);
      expect(signals).toBe(1);
      await jest.advanceTimersByTimeAsync(49);
      expect({ signals, settled }).toEqual({ signals: 1, settled: false });
      await jest.advanceTimersByTimeAsync(1);
      const err = await outcome;
      expect(err).toBeInstanceOf(RetriesExhaustedError);
      expect((err as RetriesExhaustedError).last?.kind).toBe('timeout');
      expect(signals).toBe(2);
    } finally {
      jest.useRealTimers();
    }
  });

  describe("with many jobs in flight under the consumer's shared signals", () => {
    const JOBS = 300;
    // Jest gives each test file a copy of `process`; Node emits its warnings on
    // the real one, which a function from outside the sandbox still sees.
    const hostProcess = (AbortController as unknown as { constructor: FunctionConstructor }).constructor(
      'return process',
    )() as NodeJS.Process;
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    beforeEach(() => {
      warnings.length = 0;
      hostProcess.on('warning', onWarning);
    });
    afterEach(() => {
      hostProcess.off('warning', onWarning);
    });
    /**
     * The consumer's signals, with the EventTarget default of 10 listeners:
     * Node 24 no longer applies it to AbortSignal (nodejs/node#55816), so
     * without it a pile-up would pass silently here.
     */
    const sharedSignal = () => {
      const controller = new AbortController();
      setMaxListeners(10, controller.signal);
      return controller;
    };
    const listeners = (...signals: AbortSignal[]) => signals.map((s) => getEventListeners(s, 'abort').length);
    const maxListenerWarnings = () => warnings.filter((w) => w.name === 'MaxListenersExceededWarning');
    /** Polls until `count()` reaches `n`. */
    const waitFor = async (count: () => number, n: number) => {
      for (let i = 0; count() < n; i++) {
        if (i > 500) throw new Error(`only ${count()} of ${n}`);
        await new Promise((r) => setTimeout(r, 2));
      }
    };
    const realPolicy = (sleep: Sleep = realSleep) =>
      new RetryPolicy(
        { ...defaults, callTimeoutMs: 5000, minUsefulAttemptMs: 10 },
        { now: () => performance.now() },
        sleep,
        () => 0,
      );

    it('puts no listener on them, during the calls, during the backoff, or after', async () => {
      const hardStop = sharedSignal();
      const stopRetrying = sharedSignal();
      let sleeping = 0;
      const policy = realPolicy((ms, signal) => (sleeping++, realSleep(ms, signal)));
      const firstCalls = Promise.withResolvers<void>();
      let started = 0;
      const runs = Array.from({ length: JOBS }, () => {
        let calls = 0;
        return policy.run(
          async (signal) => {
            // Like the SDK: a listener on the attempt's own signal, never removed.
            signal.addEventListener('abort', () => undefined);
            if (++calls > 1) return 'summary';
            started++;
            await firstCalls.promise;
            throw new Fail({ kind: 'rate_limited', retryable: true, status: 429, retryAfterMs: 30 });
          },
          classify,
          { deadline: performance.now() + 10_000, signal: hardStop.signal, stopRetrying: stopRetrying.signal },
        );
      });
      await waitFor(() => started, JOBS);
      expect(listeners(hardStop.signal, stopRetrying.signal)).toEqual([0, 0]);
      firstCalls.resolve();
      await waitFor(() => sleeping, JOBS);
      expect(listeners(hardStop.signal, stopRetrying.signal)).toEqual([0, 0]);
      const outcomes = await Promise.all(runs);
      expect(outcomes).toEqual(Array.from({ length: JOBS }, () => ({ value: 'summary', attempts: 2 })));
      expect(listeners(hardStop.signal, stopRetrying.signal)).toEqual([0, 0]);
      await new Promise((r) => setImmediate(r)); // process warnings are emitted on a later tick
      expect(maxListenerWarnings()).toEqual([]);
    });

    it('still cuts every call off on a hard stop, even calls that ignore their signal', async () => {
      const hardStop = sharedSignal();
      const policy = realPolicy();
      const seen: AbortSignal[] = [];
      const runs = Array.from({ length: JOBS }, () =>
        policy
          .run(
            (signal) => {
              seen.push(signal);
              return new Promise<string>(() => undefined); // hangs for ever
            },
            classify,
            { deadline: performance.now() + 10_000, signal: hardStop.signal },
          )
          .catch((e: unknown) => e),
      );
      await waitFor(() => seen.length, JOBS);
      expect(listeners(hardStop.signal)).toEqual([0]);
      const reason = new Error('drain timed out');
      hardStop.abort(reason);
      const errors = await Promise.all(runs);
      expect(errors.every((e) => e instanceof RetryCancelledError && e.attempts === 1 && e.cause === reason)).toBe(
        true,
      );
      expect(seen.every((s) => s.aborted && s.reason === reason)).toBe(true);
      await new Promise((r) => setImmediate(r));
      expect(maxListenerWarnings()).toEqual([]);
    });

    it('ends every backoff sleep on a stop request, without waiting it out', async () => {
      const hardStop = sharedSignal();
      const stopRetrying = sharedSignal();
      let sleeping = 0;
      // Each sleep's own outcome: ended by its signal, or waited out (none may be).
      const slept: ('cut short' | 'waited out')[] = [];
      const policy = realPolicy((ms, signal) => {
        sleeping++;
        return realSleep(ms, signal).then(
          () => void slept.push('waited out'),
          (err: unknown) => {
            slept.push('cut short');
            throw err;
          },
        );
      });
      const runs = Array.from({ length: JOBS }, () =>
        policy
          .run(
            async () => {
              throw new Fail({ kind: 'rate_limited', retryable: true, status: 429, retryAfterMs: 5000 });
            },
            classify,
            { deadline: performance.now() + 10_000, signal: hardStop.signal, stopRetrying: stopRetrying.signal },
          )
          .catch((e: unknown) => e),
      );
      await waitFor(() => sleeping, JOBS);
      expect(listeners(hardStop.signal, stopRetrying.signal)).toEqual([0, 0]);
      stopRetrying.abort(new Error('shutting down'));
      const errors = await Promise.all(runs);
      expect(slept).toEqual(Array.from({ length: JOBS }, () => 'cut short'));
      expect(errors.every((e) => e instanceof RetryCancelledError && e.attempts === 1)).toBe(true);
      await new Promise((r) => setImmediate(r));
      expect(maxListenerWarnings()).toEqual([]);
    });
  });
});
