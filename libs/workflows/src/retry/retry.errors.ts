import type { ErrorClass } from '@app/llm';
import { JobError } from '../consumer/job.errors';

/**
 * What RetryPolicy throws: how many attempts were made and how the last one
 * was classified. Its own failure is the job's view of that: `llm_<kind>`
 * (`llm_cancelled` when no call failed), retryable unless the last call's
 * was not. The subclasses only name what happened.
 */
export abstract class RetryError extends JobError {
  constructor(
    message: string,
    readonly attempts: number,
    readonly last: ErrorClass | undefined,
    options?: ErrorOptions,
    retryable: boolean = last?.retryable ?? true,
  ) {
    super(message, { kind: `llm_${last?.kind ?? 'cancelled'}`, retryable }, options);
  }

  /** Worth another delivery later: `failure.retryable`. */
  get transient(): boolean {
    return this.failure.retryable;
  }
}

/**
 * The call failed in a way retrying cannot fix (a 400, an unknown error): never retryable, whatever its last class
 * says.
 */
export class NonRetryableError extends RetryError {
  constructor(message: string, attempts: number, last: ErrorClass | undefined, options?: ErrorOptions) {
    super(message, attempts, last, options, false);
  }
}

/** Every attempt failed with a retryable error. */
export class RetriesExhaustedError extends RetryError {}

/**
 * The job's deadline leaves no room for another useful attempt. Never
 * retried in-process; the queue redelivers the job later.
 */
export class DeadlineExceededError extends RetryError {}

/** Shutdown (or the caller) cancelled the call or a backoff sleep. */
export class RetryCancelledError extends RetryError {}
