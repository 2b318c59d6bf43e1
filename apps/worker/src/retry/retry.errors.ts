import type { LlmErrorClass } from '@app/llm';

/** Base of what RetryPolicy throws: how many attempts were made, and what the last one was. */
export abstract class RetryError extends Error {
  constructor(
    message: string,
    readonly attempts: number,
    readonly last: LlmErrorClass | undefined,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = new.target.name;
  }
  /** Worth another delivery later (true), or never going to work (false). */
  abstract readonly transient: boolean;
}

/** The call failed in a way retrying cannot fix (a 400, an unknown error). */
export class NonRetryableError extends RetryError {
  readonly transient = false;
}

/** Every attempt failed with a retryable error. */
export class RetriesExhaustedError extends RetryError {
  readonly transient = true;
}

/**
 * The job's deadline leaves no room for another useful attempt. Never
 * retried in-process; the queue redelivers the job later.
 */
export class DeadlineExceededError extends RetryError {
  readonly transient = true;
}

/** Shutdown (or the caller) cancelled the call or a backoff sleep. */
export class RetryCancelledError extends RetryError {
  readonly transient = true;
}
