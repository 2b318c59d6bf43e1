import { HttpStatus } from '@nestjs/common';
import { PROBLEM_TYPE_PREFIX, ProblemException } from '@app/problem';

export const IdempotencyProblemTypes = {
  keyMissing: `${PROBLEM_TYPE_PREFIX}idempotency-key-missing`,
  keyInvalid: `${PROBLEM_TYPE_PREFIX}idempotency-key-invalid`,
  inProgress: `${PROBLEM_TYPE_PREFIX}idempotency-request-in-progress`,
  keyReused: `${PROBLEM_TYPE_PREFIX}idempotency-key-reused`,
  storeUnavailable: `${PROBLEM_TYPE_PREFIX}idempotency-store-unavailable`,
  outcomeUnknown: `${PROBLEM_TYPE_PREFIX}outcome-unknown`,
} as const;

export class IdempotencyKeyMissingException extends ProblemException {
  constructor() {
    super({
      type: IdempotencyProblemTypes.keyMissing,
      title: 'An Idempotency-Key header is required',
      status: HttpStatus.BAD_REQUEST,
      detail: 'Send an Idempotency-Key header of 16 to 128 printable ASCII characters, unique per operation.',
    });
  }
}

export class IdempotencyKeyInvalidException extends ProblemException {
  /** `header`: the one at fault (an Idempotency-Scope is refused as a key is). */
  constructor(reason: string, header = 'Idempotency-Key') {
    super({
      type: IdempotencyProblemTypes.keyInvalid,
      title: `The ${header} header is malformed`,
      status: HttpStatus.BAD_REQUEST,
      detail: reason,
    });
  }
}

export class IdempotencyInProgressException extends ProblemException {
  constructor(retryAfterSeconds: number) {
    super({
      type: IdempotencyProblemTypes.inProgress,
      title: 'A request with this Idempotency-Key is still being processed',
      status: HttpStatus.CONFLICT,
      detail: `Retry after ${retryAfterSeconds} s to get its answer.`,
      headers: { 'Retry-After': String(retryAfterSeconds) },
    });
  }
}

export class IdempotencyKeyReusedException extends ProblemException {
  constructor() {
    super({
      type: IdempotencyProblemTypes.keyReused,
      title: 'This Idempotency-Key was used with a different request body',
      status: HttpStatus.UNPROCESSABLE_ENTITY,
      detail: 'An Idempotency-Key names one operation; use a new key for a different request.',
    });
  }
}

export class IdempotencyStoreUnavailableException extends ProblemException {
  constructor() {
    super({
      type: IdempotencyProblemTypes.storeUnavailable,
      title: 'The request cannot be made safe to retry right now',
      status: HttpStatus.SERVICE_UNAVAILABLE,
      detail: 'The idempotency store is unreachable; nothing was done. Retry with the same key.',
      headers: { 'Retry-After': '1' },
    });
  }
}

/**
 * Thrown by a handler that cannot tell whether its effect happened (a
 * payment provider that did not answer in time): a 503 with Retry-After, and
 * the key is not freed but left as a dead request's, so the next request
 * with it takes it over knowingly and the route's recovery looks the outcome
 * up before anything is done again.
 */
export class IdempotencyOutcomeUnknownException extends ProblemException {
  constructor(detail: string, retryAfterSeconds = 1) {
    super({
      type: IdempotencyProblemTypes.outcomeUnknown,
      title: 'The outcome is not known yet',
      status: HttpStatus.SERVICE_UNAVAILABLE,
      detail,
      headers: { 'Retry-After': String(retryAfterSeconds) },
    });
  }
}
