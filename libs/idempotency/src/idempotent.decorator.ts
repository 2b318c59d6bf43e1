import { Reflector } from '@nestjs/core';

export interface IdempotentOptions {
  /** Reject a request without an Idempotency-Key (400). Default true. */
  readonly required?: boolean;
  /** How long a running request holds the key before another may take over. */
  readonly lockTtlMs?: number;
  /** How long a finished answer is kept for replay. */
  readonly resultTtlMs?: number;
  /** Answers larger than this are not stored; the key is released instead. */
  readonly maxStoredBodyBytes?: number;
}

/**
 * Makes a controller method (or every method of a controller) safe to retry:
 * the same Idempotency-Key with the same body gets the same answer, and the
 * handler runs at most once per key while its record lives. Options on a
 * method override those on its class, which override the module's defaults.
 */
export const Idempotent = Reflector.createDecorator<IdempotentOptions | undefined>();
