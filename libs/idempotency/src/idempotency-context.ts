import { createParamDecorator, ExecutionContext } from '@nestjs/common';

/** What the interceptor established about a request before its handler ran. */
export interface IdempotencyRequestContext {
  /** The Idempotency-Key; for a request under an Idempotency-Scope, `<scope>,<the body's fingerprint digest>`. */
  readonly key: string;
  /** The Idempotency-Scope the request was sent under (routes with `acceptsRunScope`), if any. */
  readonly runScope?: string;
  readonly scope: string;
  readonly method: string;
  readonly path: string;
  /** `v2:` and the SHA-256 hex of the canonical JSON body, numbers as written (fingerprintBody). */
  readonly fingerprint: string;
  /**
   * `<scope>:<METHOD>:<path>:<key>`: names the operation. Stable across
   * retries, so a handler can derive ids from it (the same request always
   * names the same job).
   */
  readonly operation: string;
}

const CONTEXT = Symbol('idempotency:context');

export function setIdempotencyContext(request: object, context: IdempotencyRequestContext): void {
  Object.defineProperty(request, CONTEXT, { value: context, configurable: true });
}

export function getIdempotencyContext(request: object): IdempotencyRequestContext | undefined {
  return (request as { [CONTEXT]?: IdempotencyRequestContext })[CONTEXT];
}

/** The request's idempotency context, or undefined on a request without a key. */
export const IdempotencyContext = createParamDecorator(
  (_: unknown, ctx: ExecutionContext): IdempotencyRequestContext | undefined =>
    getIdempotencyContext(ctx.switchToHttp().getRequest<object>()),
);

const OUTCOME = Symbol('idempotency:outcome');

/** What the idempotency layer did with a request, for a route's own metrics. */
export type IdempotencyRequestOutcome =
  'new' | 'replayed' | 'attached' | 'recovered' | 'in_progress' | 'mismatch' | 'key_invalid' | 'store_unavailable';

export function setIdempotencyOutcome(request: object, outcome: IdempotencyRequestOutcome): void {
  Object.defineProperty(request, OUTCOME, { value: outcome, configurable: true, writable: true });
}

/** Undefined for a request the idempotency layer did not handle (no key, or a route without @Idempotent()). */
export function idempotencyOutcomeOf(request: object): IdempotencyRequestOutcome | undefined {
  return (request as { [OUTCOME]?: IdempotencyRequestOutcome })[OUTCOME];
}

/** The running request's record, for a handler that finalises it inside its own transaction. */
export interface PendingIdempotencyRecord {
  /**
   * Stores the answer as part of `tx`, the handler's own open transaction
   * (an EntityManager for a PostgreSQL store): the answer commits with the
   * effect's rows, or neither does. Return the same body with the same
   * status from the handler. Throws IdempotencyLockLostError when another
   * request holds the key now: let it roll the transaction back.
   */
  completeWithin(
    tx: unknown,
    answer: { readonly status: number; readonly body: unknown; readonly headers?: Readonly<Record<string, string>> },
  ): Promise<void>;
}

/** The lock is not this request's any more: another request took the key over. */
export class IdempotencyLockLostError extends Error {
  constructor() {
    super("the idempotency lock is no longer this request's: another request holds the key");
    this.name = 'IdempotencyLockLostError';
  }
}

const PENDING = Symbol('idempotency:pending');

export function setPendingRecord(request: object, record: PendingIdempotencyRecord): void {
  Object.defineProperty(request, PENDING, { value: record, configurable: true });
}

/** The running request's record, or undefined on a request without a key (or that is not the one running). */
export const IdempotencyRecord = createParamDecorator(
  (_: unknown, ctx: ExecutionContext): PendingIdempotencyRecord | undefined =>
    (ctx.switchToHttp().getRequest<object>() as { [PENDING]?: PendingIdempotencyRecord })[PENDING],
);
