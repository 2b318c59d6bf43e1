import { Inject } from '@nestjs/common';
import { setTimeout as delay } from 'node:timers/promises';

/** A monotonic clock in milliseconds (performance.now in production). */
export interface Clock {
  now(): number;
}
/** Resolves after `ms`, rejects with the signal's reason when it aborts first. */
export type Sleep = (ms: number, signal?: AbortSignal) => Promise<void>;
/** Uniform in [0, 1). */
export type Random = () => number;

export const RETRY_CLOCK = 'retry:clock';
export const RETRY_SLEEP = 'retry:sleep';
export const RETRY_RANDOM = 'retry:random';
export const RETRY_POLICY_OPTIONS = 'retry:options';
export const InjectRetryPolicyOptions = (): ParameterDecorator => Inject(RETRY_POLICY_OPTIONS);

export interface RetryPolicyOptions {
  /** Total attempts, the first one included. */
  readonly maxAttempts: number;
  /** Hard wall-clock limit of one attempt (shortened to what the deadline leaves). */
  readonly callTimeoutMs: number;
  /** Backoff (backoffDelay): full jitter over min(maxDelayMs, base × 2^(attempt-2)) before attempt 2, 3, ... */
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
  /** A provider's Retry-After is honoured up to this. */
  readonly maxRetryAfterMs: number;
  /** An attempt shorter than this is not worth starting. */
  readonly minUsefulAttemptMs: number;
}

export const monotonicClock: Clock = { now: () => performance.now() };

export const realSleep: Sleep = async (ms, signal) => {
  try {
    await delay(ms, undefined, { signal });
  } catch (err) {
    // node:timers/promises rejects with an AbortError that carries the reason as its cause; the contract is the reason.
    throw signal?.aborted ? signal.reason : err;
  }
};
