import { Inject, Injectable } from '@nestjs/common';
import { backoffDelay } from '@app/config';
import { CallTimeoutError, type ErrorClass } from '@app/llm';
import { DeadlineExceededError, NonRetryableError, RetriesExhaustedError, RetryCancelledError } from './retry.errors';
import {
  type Clock,
  InjectRetryPolicyOptions,
  type Random,
  RETRY_CLOCK,
  RETRY_RANDOM,
  RETRY_SLEEP,
  type RetryPolicyOptions,
  type Sleep,
} from './retry-policy.tokens';

export interface RetryContext {
  /** Monotonic time (the injected clock) by which the whole job must be done. */
  readonly deadline: number;
  /** Aborts everything: the running call and any backoff sleep (a hard stop). */
  readonly signal?: AbortSignal;
  /**
   * Stops retrying but lets a call in progress finish: no new attempt starts
   * and a backoff sleep ends at once (shutdown must not wait out a backoff).
   */
  readonly stopRetrying?: AbortSignal;
  /** Told about each failed attempt, for metrics and logs. */
  readonly onAttemptFailed?: (attempt: number, error: ErrorClass) => void;
}

export interface RetryOutcome<T> {
  readonly value: T;
  readonly attempts: number;
}

/**
 * Runs one operation with retries inside one delivery of a job.
 * Each attempt gets min(call timeout, time left) as a hard wall-clock limit:
 * the attempt's AbortSignal fires, and the policy stops waiting even if the
 * operation ignores it. Retryable failures sleep with full-jitter exponential
 * backoff, or what Retry-After asks (capped); it stops at maxAttempts, or as
 * soon as the next sleep would leave less than one useful attempt before the
 * deadline. The clock, sleep and random source are injected.
 */
@Injectable()
export class RetryPolicy {
  constructor(
    @InjectRetryPolicyOptions() private readonly options: RetryPolicyOptions,
    @Inject(RETRY_CLOCK) private readonly clock: Clock,
    @Inject(RETRY_SLEEP) private readonly sleep: Sleep,
    @Inject(RETRY_RANDOM) private readonly random: Random,
  ) {}

  async run<T>(
    operation: (signal: AbortSignal) => Promise<T>,
    classify: (err: unknown) => ErrorClass,
    ctx: RetryContext,
  ): Promise<RetryOutcome<T>> {
    const { maxAttempts, callTimeoutMs } = this.options;
    const usefulMs = Math.min(this.options.minUsefulAttemptMs, callTimeoutMs);
    let last: ErrorClass | undefined;

    for (let attempt = 1; attempt <= maxAttempts; attempt++) {
      const remaining = ctx.deadline - this.clock.now();
      if (remaining < usefulMs) {
        throw new DeadlineExceededError(`job deadline reached after ${attempt - 1} attempts`, attempt - 1, last);
      }
      if (attempt > 1 && (ctx.signal?.aborted || ctx.stopRetrying?.aborted)) {
        throw new RetryCancelledError('stopped before a retry', attempt - 1, last);
      }
      if (ctx.signal?.aborted) throw new RetryCancelledError('cancelled', 0, last, { cause: ctx.signal.reason });

      try {
        const value = await this.attempt(operation, Math.min(callTimeoutMs, remaining), ctx.signal);
        return { value, attempts: attempt };
      } catch (err) {
        if (ctx.signal?.aborted)
          throw new RetryCancelledError('cancelled during a call', attempt, last, { cause: err });
        last = classify(err);
        ctx.onAttemptFailed?.(attempt, last);
        if (!last.retryable) {
          throw new NonRetryableError(`model call failed: ${describe(err)}`, attempt, last, { cause: err });
        }
        if (attempt === maxAttempts) {
          throw new RetriesExhaustedError(`model call failed ${attempt} times: ${describe(err)}`, attempt, last, {
            cause: err,
          });
        }
        const delay = this.delayBefore(attempt + 1, last);
        if (this.clock.now() + delay + usefulMs > ctx.deadline) {
          throw new DeadlineExceededError(
            `job deadline leaves no room for attempt ${attempt + 1} after a ${delay} ms wait`,
            attempt,
            last,
            { cause: err },
          );
        }
        const sleepSignal = anySignal(ctx.signal, ctx.stopRetrying);
        try {
          await this.sleep(delay, sleepSignal);
        } catch (sleepErr) {
          throw new RetryCancelledError('cancelled during backoff', attempt, last, { cause: sleepErr });
        }
      }
    }
    // maxAttempts >= 1, so the loop returned or threw.
    throw new RetriesExhaustedError('no attempt made', 0, last);
  }

  /** The wait before attempt `next` (2, 3, ...): what Retry-After asks (capped), or the full-jitter backoff. */
  delayBefore(next: number, failure: ErrorClass): number {
    if (failure.retryAfterMs !== undefined) return Math.min(failure.retryAfterMs, this.options.maxRetryAfterMs);
    return backoffDelay(
      next - 2,
      { baseMs: this.options.baseDelayMs, capMs: this.options.maxDelayMs, jitter: 'full' },
      this.random,
    );
  }

  /**
   * One attempt under its own wall-clock limit, which also ends the wait for
   * an operation that ignores its signal. The limit is a timer cleared when
   * the attempt ends: AbortSignal.timeout() would keep its signal (and the
   * attempt's, which follows it) alive for the whole limit after every
   * attempt; its reason would be a DOMException rather than our
   * CallTimeoutError; and jest's fake timers cannot move it. The outer signal
   * is shared by every job in flight, so nothing here listens on it:
   * AbortSignal.any() follows its sources without adding listeners to them,
   * and the one listener we need goes on this attempt's own signal and is
   * removed when it ends.
   */
  private async attempt<T>(
    operation: (signal: AbortSignal) => Promise<T>,
    limitMs: number,
    outer?: AbortSignal,
  ): Promise<T> {
    const limit = new AbortController();
    const timer = setTimeout(() => limit.abort(new CallTimeoutError(limitMs)), limitMs);
    const signal = outer ? AbortSignal.any([outer, limit.signal]) : limit.signal;
    const aborted = Promise.withResolvers<never>();
    const stop = () => aborted.reject(signal.reason);
    signal.addEventListener('abort', stop, { once: true });
    try {
      signal.throwIfAborted();
      return await Promise.race([operation(signal), aborted.promise]);
    } catch (err) {
      // Whatever the operation threw on abort (the SDK's APIUserAbortError, a
      // socket error), the cause that counts is our own timer.
      throw limit.signal.aborted ? limit.signal.reason : err;
    } finally {
      clearTimeout(timer);
      signal.removeEventListener('abort', stop);
    }
  }
}

/** Always a signal of its own, even for one source: a sleep's listener must not land on a shared signal. */
function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal | undefined {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  return present.length === 0 ? undefined : AbortSignal.any(present);
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
