import { applyDecorators } from '@nestjs/common';
import { PATH_METADATA } from '@nestjs/common/constants';
import { Reflector } from '@nestjs/core';
import { inspect } from 'node:util';
import { ApiHeader, ApiResponse } from '@nestjs/swagger';
import { ApiProblemResponse } from '@app/problem';

export interface IdempotentOptions {
  /** Reject a request without an Idempotency-Key (400). Default true. */
  readonly required?: boolean;
  /** How long a running request holds the key before another may take over. */
  readonly lockTtlMs?: number;
  /** How long a finished answer is kept for replay. */
  readonly resultTtlMs?: number;
  /** Answers larger than this are not stored; the key is released instead. */
  readonly maxStoredBodyBytes?: number;
  /**
   * Which finished answers are stored, by status; the others free the key.
   * Default: all but 5xx and the "not now" 4xx (408, 409, 425, 429).
   */
  readonly storesStatus?: (status: number) => boolean;
  /**
   * A duplicate of a request that is still running follows it instead of
   * getting a 409: a streamed answer from its first frame, live, and a whole
   * answer once it is stored, from whichever instance runs it. It waits at
   * most `waitMs` for the answer to start, then gets the 409.
   */
  readonly attach?: { readonly waitMs: number };
  /** How this route's errors look when they are stored or end a stream. Default: problem+json, and a cut stream. */
  readonly errors?: IdempotencyErrorFormat;
  /** The name of one of the module's `stores`, for this route's records; default the module's `store`. */
  readonly store?: string;
  /**
   * Runs before a request re-runs a key whose earlier request died holding
   * it (its lock expired; stores that can tell, e.g. PostgreSQL): it may look
   * up what that request really did and answer from it, instead of doing it
   * again. A provider class, resolved from the app.
   */
  readonly recover?: abstract new (...args: never[]) => IdempotencyRecovery;
  /**
   * The route also takes `Idempotency-Scope` (same syntax as the key) in
   * place of `Idempotency-Key`, for an agent's run that sends one set of
   * headers on every step: the operation is the scope plus the body's
   * fingerprint, so each distinct request of the run is its own operation
   * and a retried one replays (another body is another operation, never a
   * 422). Both headers on one request are a 400.
   */
  readonly acceptsRunScope?: boolean;
}

/** The answer a recovery found for a request that died: stored and sent like the handler's own. */
export interface RecoveredAnswer {
  readonly status: number;
  readonly body: unknown;
  readonly headers?: Readonly<Record<string, string>>;
}

/** A route's recovery hook (IdempotentOptions.recover). */
export interface IdempotencyRecovery {
  /**
   * The real outcome of the earlier request with this operation, or
   * undefined when it did nothing (the handler then runs). Throw when it
   * cannot be known yet (IdempotencyOutcomeUnknownException answers 503 with
   * Retry-After): the key stays a dead request's, and the next request with
   * it recovers again.
   *
   * A recovery that records what it found in rows of its own can do it as
   * the handler does: `record.completeWithin(tx, answer)` inside its
   * transaction, so the rows and the stored answer commit together; then
   * exactly that answer is sent, whatever the hook returns.
   */
  recover(
    context: import('./idempotency-context').IdempotencyRequestContext,
    request: import('express').Request,
    record: import('./idempotency-context').PendingIdempotencyRecord,
  ): Promise<RecoveredAnswer | undefined>;
}

/** A route's own error format, for the answers the idempotency layer writes itself. */
export interface IdempotencyErrorFormat {
  /** A business error of the handler, as it is stored and replayed. */
  render(exception: unknown): {
    readonly status: number;
    readonly headers: Readonly<Record<string, string>>;
    readonly body: string;
  };
  /** The last frame every caller of a streamed answer gets when it broke before its end. */
  brokenStreamFrame(): string;
}

/** The timer that renews a lock runs every half lock TTL; Node's timers take at most this many ms. */
const MAX_LOCK_TTL_MS = 2 ** 31 - 1;
const UNITS = { lockTtlMs: 'milliseconds', resultTtlMs: 'milliseconds', maxStoredBodyBytes: 'bytes' } as const;

/**
 * Throws, naming `where` and the option, unless the TTLs and the size cap are
 * positive integers. Checked when the decorator is applied and when the
 * module starts, not at the first request: a fractional lock TTL would make
 * Redis refuse PEXPIRE after the claim had already written its marker,
 * leaving a lock that never expires.
 */
export function assertValidIdempotentOptions(
  options: Pick<IdempotentOptions, keyof typeof UNITS | 'required'> | IdempotentOptions | undefined,
  where: string,
): void {
  if (options === undefined) return;
  if (typeof options !== 'object' || options === null) throw new Error(`${where}: the options must be an object`);
  if (options.required !== undefined && typeof options.required !== 'boolean') {
    throw new Error(`${where}: required must be true or false, got ${String(options.required)}`);
  }
  for (const name of Object.keys(UNITS) as (keyof typeof UNITS)[]) {
    const value: unknown = options[name];
    if (value === undefined) continue;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
      throw new Error(`${where}: ${name} must be a positive whole number of ${UNITS[name]}, got ${inspect(value)}`);
    }
  }
  const { attach, storesStatus, errors } = options as IdempotentOptions;
  if (attach !== undefined) {
    const waitMs: unknown = (attach as { waitMs?: unknown } | null)?.waitMs;
    if (typeof waitMs !== 'number' || !Number.isSafeInteger(waitMs) || waitMs <= 0 || waitMs > MAX_LOCK_TTL_MS) {
      throw new Error(
        `${where}: attach.waitMs must be a positive whole number of milliseconds, got ${inspect(waitMs)}`,
      );
    }
  }
  if (storesStatus !== undefined && typeof storesStatus !== 'function')
    throw new Error(`${where}: storesStatus must be a function`);
  const { store, recover } = options as IdempotentOptions;
  if (store !== undefined && (typeof store !== 'string' || store.length === 0))
    throw new Error(`${where}: store must be a store's name`);
  if (recover !== undefined && typeof recover !== 'function')
    throw new Error(`${where}: recover must be a provider class`);
  const { acceptsRunScope } = options as IdempotentOptions;
  if (acceptsRunScope !== undefined && typeof acceptsRunScope !== 'boolean')
    throw new Error(`${where}: acceptsRunScope must be true or false`);
  if (
    errors !== undefined &&
    (typeof errors?.render !== 'function' || typeof errors?.brokenStreamFrame !== 'function')
  ) {
    throw new Error(`${where}: errors must have render() and brokenStreamFrame()`);
  }
  if (options.lockTtlMs !== undefined && options.lockTtlMs > MAX_LOCK_TTL_MS) {
    throw new Error(`${where}: lockTtlMs must be at most ${MAX_LOCK_TTL_MS} (about 24 days), got ${options.lockTtlMs}`);
  }
}

/** The metadata IdempotencyInterceptor reads (method options override class options). */
export const IdempotentMetadata = Reflector.createDecorator<IdempotentOptions | undefined>();

/**
 * Makes a controller method (or every method of a controller) safe to retry:
 * the same Idempotency-Key with the same body gets the same answer, and the
 * handler runs at most once per key while its record lives. Options on a
 * method override those on its class, which override the module's defaults.
 * The OpenAPI document gets the header and the idempotency answers with it.
 */
export function Idempotent(options?: IdempotentOptions): MethodDecorator & ClassDecorator {
  return (target: object, key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const where = descriptor
      ? `@Idempotent() on ${(target as { constructor: { name: string } }).constructor.name}.${String(key)}`
      : `@Idempotent() on ${(target as { name: string }).name}`;
    assertValidIdempotentOptions(options, where);
    if (descriptor) {
      IdempotentMetadata(options)(target, key!, descriptor);
      documentation(options)(target, key!, descriptor);
      return;
    }
    IdempotentMetadata(options)(target as never);
    // On a class: document each route that has no options of its own. A
    // method's own @Idempotent() replaces the class's options as a whole, at
    // run time (getAllAndOverride) and here alike.
    const proto = (target as { prototype: object }).prototype;
    for (const name of Object.getOwnPropertyNames(proto)) {
      const method = Object.getOwnPropertyDescriptor(proto, name);
      if (name === 'constructor' || typeof method?.value !== 'function') continue;
      const fn = method.value as object;
      if (!Reflect.hasOwnMetadata(PATH_METADATA, fn)) continue;
      if (Reflect.hasOwnMetadata(IdempotentMetadata.KEY, fn)) continue;
      documentation(options)(proto, name, method);
    }
  };
}

/** The OpenAPI description of what @Idempotent() adds to a route. */
function documentation(options: IdempotentOptions | undefined): MethodDecorator {
  // A route with its own error format documents its errors' schema itself; here only what they mean.
  const respond = options?.errors
    ? (
        status: number,
        description: string,
        headers?: Record<string, { description: string; schema: { type: 'integer' } }>,
      ) => ApiResponse({ status, description, ...(headers ? { headers } : {}) })
    : ApiProblemResponse;
  return applyDecorators(
    ApiHeader({
      name: 'Idempotency-Key',
      required: options?.required ?? true,
      description:
        'One key per operation, reused for each retry of it: 16 to 128 printable ASCII characters without spaces or commas, ' +
        'bare or as a Structured Field string ("..."). The same key and body get the same answer, with Idempotent-Replayed: true.',
      schema: { type: 'string', minLength: 16, maxLength: 128 },
    }),
    respond(400, 'The Idempotency-Key is missing or malformed, or the body is invalid. Nothing was done.'),
    respond(409, 'A request with this key is still running. Retry after Retry-After seconds to get its answer.', {
      'Retry-After': { description: 'Seconds until the running request’s lock frees', schema: { type: 'integer' } },
    }),
    respond(422, 'This key was already used with a different body.'),
    respond(503, 'The request cannot be made safe to retry right now; nothing was done. Retry with the same key.'),
    ...(options?.acceptsRunScope
      ? [
          ApiHeader({
            name: 'Idempotency-Scope',
            required: false,
            description:
              'In place of Idempotency-Key, for an agent’s run that sends the same headers on every step (same syntax): ' +
              'each distinct body under the scope is an operation of its own, and a retried one gets its first answer. ' +
              'Both headers on one request: 400.',
            schema: { type: 'string', minLength: 16, maxLength: 128 },
          }),
        ]
      : []),
  );
}
