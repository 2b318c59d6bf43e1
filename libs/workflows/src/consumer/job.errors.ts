import type { ErrorClass } from '@app/llm';

/**
 * The worker's one error: a failure and its ErrorClass. The consumer reads
 * the class only: a retryable failure leaves the message pending for
 * redelivery, any other dead-letters it at once, `kind` being the reason.
 */
export class JobError extends Error {
  constructor(
    message: string,
    readonly failure: ErrorClass,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * Not this delivery's to run (another delivery holds the work and decides):
 * retryable, and handed back with its delivery count set back (ABANDON), so
 * that waiting behind a slow holder never counts toward maxDeliveries and
 * dead-letters a run that is doing fine.
 */
export class HandBackError extends JobError {}

/** A malformed message never gets better. */
export const MALFORMED: ErrorClass = { kind: 'malformed', retryable: false };

/** What anything but a JobError stands for: a bug, never retried. */
export const UNEXPECTED: ErrorClass = { kind: 'unexpected', retryable: false };

export function failureOf(err: unknown): ErrorClass {
  return err instanceof JobError ? err.failure : UNEXPECTED;
}
