import {
  CallHandler,
  ExecutionContext,
  HttpException,
  Inject,
  Injectable,
  Logger,
  NestInterceptor,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { isRejectedByPipes } from '@nestjs/core/internal';
import { PROBLEM_CONTENT_TYPE, toProblem } from '@app/problem';
import type { Request, Response as ExpressResponse } from 'express';
import { createHash, randomUUID } from 'node:crypto';
import { compile } from 'path-to-regexp';
import { isObservable, lastValueFrom, Observable, of, from } from 'rxjs';
import { fingerprintBody } from './canonical-json';
import { IdempotencyRequestContext, setIdempotencyContext } from './idempotency-context';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from './idempotency-key';
import {
  IdempotencyInProgressException,
  IdempotencyKeyMissingException,
  IdempotencyKeyReusedException,
  IdempotencyStoreUnavailableException,
} from './idempotency.errors';
import { IdempotencyMetrics } from './idempotency.metrics';
import { IDEMPOTENCY_MODULE_OPTIONS, type IdempotencyModuleOptions } from './idempotency.module-definition';
import { assertValidIdempotentOptions, IdempotentMetadata, type IdempotentOptions } from './idempotent.decorator';
import { ClaimResult, IdempotencyStore, InjectIdempotencyStore, StoredResponse } from './idempotency-store.interface';
import { LockLease } from './lock-lease';
import { HandlerDurations, retryAfterSeconds } from './retry-after';

export const DEFAULT_LOCK_TTL_MS = 10_000;
export const DEFAULT_RESULT_TTL_MS = 86_400_000;
export const DEFAULT_MAX_STORED_BODY_BYTES = 256 * 1024;
export const DEFAULT_REPLAY_HEADERS: readonly string[] = [
  'location',
  'content-type',
  'content-language',
  'content-location',
  'etag',
  'last-modified',
  'link',
  'cache-control',
];
const NEVER_REPLAYED = new Set(['set-cookie', 'set-cookie2', 'authorization', 'www-authenticate']);
const NULL_BODY_STATUSES = new Set([204, 205, 304]);
/**
 * 4xx answers that say "not now" rather than "no": Request Timeout, Conflict,
 * Too Early, Too Many Requests. Stored, they would be replayed after the
 * client waited as told (Retry-After); they release the key instead.
 */
const TRANSIENT_4XX = new Set([408, 409, 425, 429]);

interface RouteSettings {
  readonly required: boolean;
  readonly lockTtlMs: number;
  readonly resultTtlMs: number;
  readonly maxStoredBodyBytes: number;
}

interface Attempt {
  readonly context: IdempotencyRequestContext;
  readonly token: string;
  readonly settings: RouteSettings;
  /** The key, hashed: keys are client secrets of a kind and stay out of logs. */
  readonly keyHash: string;
  /** The route's handler: whose run times tell a duplicate when to come back. */
  readonly handler: object;
}

/**
 * Runs every @Idempotent() handler at most once per (scope, method, path,
 * key): the first request claims the key atomically, runs, and stores its
 * answer; a retry with the same body gets that answer replayed, or a 409
 * while the first one runs; the key with another body is a 422. Routes
 * without the decorator pass straight through.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger(IdempotencyInterceptor.name);
  private readonly replayHeaders: ReadonlySet<string>;
  private readonly durations = new HandlerDurations();

  constructor(
    private readonly reflector: Reflector,
    @InjectIdempotencyStore() private readonly store: IdempotencyStore,
    @Inject(IDEMPOTENCY_MODULE_OPTIONS) private readonly options: IdempotencyModuleOptions,
    private readonly metrics: IdempotencyMetrics,
  ) {
    assertValidIdempotentOptions(options, 'IdempotencyModule options');
    this.replayHeaders = new Set(
      (options.replayHeaders ?? DEFAULT_REPLAY_HEADERS).map((h) => h.toLowerCase()).filter((h) => !NEVER_REPLAYED.has(h)),
    );
  }

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    if (context.getType() !== 'http') return next.handle();
    const route = this.reflector.getAllAndOverride<IdempotentOptions | undefined>(IdempotentMetadata, [
      context.getHandler(),
      context.getClass(),
    ]);
    if (route === undefined) return next.handle();

    const http = context.switchToHttp();
    const req = http.getRequest<Request>();
    const res = http.getResponse<ExpressResponse>();
    const settings = this.settingsFor(route);

    let key: string | undefined;
    try {
      key = parseIdempotencyKey(req.headersDistinct[IDEMPOTENCY_KEY_HEADER]);
    } catch (err) {
      this.metrics.count('key_invalid');
      throw err;
    }
    if (key === undefined) {
      if (!settings.required) return next.handle();
      this.metrics.count('key_invalid');
      throw new IdempotencyKeyMissingException();
    }

    const scope = this.options.scope(req);
    const method = req.method.toUpperCase();
    const path = operationPath(req);
    const ctx: IdempotencyRequestContext = {
      key,
      scope,
      method,
      path,
      fingerprint: fingerprintBody(req.body),
      operation: `${scope}:${method}:${path}:${key}`,
    };
    setIdempotencyContext(req, ctx);
    const attempt: Attempt = {
      context: ctx,
      token: randomUUID(),
      settings,
      keyHash: createHash('sha256').update(ctx.operation).digest('hex').slice(0, 16),
      handler: context.getHandler(),
    };

    let claim: ClaimResult;
    try {
      claim = await this.store.claim(ctx.operation, attempt.token, ctx.fingerprint, settings.lockTtlMs);
    } catch (err) {
      this.metrics.count('store_unavailable');
      this.logger.warn(`idempotency store unavailable, refusing ${method} ${path}: ${errorText(err)}`);
      throw new IdempotencyStoreUnavailableException();
    }

    switch (claim.outcome) {
      case 'completed':
        if (claim.fingerprint !== ctx.fingerprint) return this.mismatch();
        this.metrics.count('replayed');
        return of(this.replay(claim.response));
      case 'in-progress':
        if (claim.fingerprint !== ctx.fingerprint) return this.mismatch();
        this.metrics.count('in_progress');
        throw new IdempotencyInProgressException(retryAfterSeconds(claim, this.durations.typical(attempt.handler)));
      case 'claimed':
        this.metrics.count('new');
        // Subscribed here, not by the caller: the handler's outcome is recorded
        // even if the client goes away meanwhile, so the key is never released
        // under a handler that is still running.
        return from(this.run(next, req, res, attempt));
    }
  }

  private mismatch(): never {
    this.metrics.count('mismatch');
    throw new IdempotencyKeyReusedException();
  }

  private async run(next: CallHandler, req: Request, res: ExpressResponse, attempt: Attempt): Promise<unknown> {
    const { operation } = attempt.context;
    const lease = new LockLease(
      this.store,
      operation,
      attempt.token,
      attempt.settings.lockTtlMs,
      () => this.lockLost(attempt, 'renewal refused'),
      (err) => this.logger.warn(`idempotency lock renewal failed (key ${attempt.keyHash}): ${errorText(err)}`),
    );
    const started = performance.now();
    let body: unknown;
    try {
      body = await lastValueFrom(next.handle(), { defaultValue: undefined });
    } catch (err) {
      lease.stop();
      // A body the pipes refused never ran the handler: its milliseconds say nothing of a run.
      if (!isRejectedByPipes(req)) this.durations.record(attempt.handler, performance.now() - started);
      await this.settleFailure(err, req, res, attempt, lease.lost);
      throw err;
    }
    lease.stop();
    this.durations.record(attempt.handler, performance.now() - started);
    await this.settleSuccess(body, res, attempt, lease.lost);
    return body;
  }

  private async settleSuccess(body: unknown, res: ExpressResponse, attempt: Attempt, lost: boolean): Promise<void> {
    if (res.headersSent) return this.notStoredAlreadySent(attempt, lost);
    const status = res.statusCode;
    if (status >= 500 || TRANSIENT_4XX.has(status)) return this.release(attempt, lost);
    let serialised: ReturnType<typeof serialiseBody>;
    try {
      serialised = serialiseBody(body);
    } catch (err) {
      // A value JSON cannot hold (a BigInt, a cycle): a bug in the handler that
      // Express could not send either. The exception filter answers 500 with
      // this error (and logs it); the key must not stay locked for the lock TTL meanwhile.
      this.logger.warn(`idempotency: the answer cannot be serialised (${errorText(err)}); not stored, key ${attempt.keyHash} released`);
      this.metrics.count('not_stored');
      await this.release(attempt, lost);
      throw err;
    }
    if (serialised === undefined) {
      this.logger.warn(`idempotency: a ${typeName(body)} answer cannot be stored; key ${attempt.keyHash} released`);
      this.metrics.count('not_stored');
      return this.release(attempt, lost);
    }
    const headers = this.pickHeaders(res.getHeaders());
    headers['content-type'] ??= serialised.contentType;
    await this.complete(attempt, { status, headers, body: serialised.text }, lost);
  }

  private async settleFailure(err: unknown, req: Request, res: ExpressResponse, attempt: Attempt, lost: boolean): Promise<void> {
    // A pipe (validation) refused the request: the handler never ran, so a
    // corrected retry with the same key must run for real.
    if (isRejectedByPipes(req)) return this.release(attempt, lost);
    if (res.headersSent) return this.notStoredAlreadySent(attempt, lost);
    const status = err instanceof HttpException ? err.getStatus() : 500;
    if (status >= 400 && status < 500 && !TRANSIENT_4XX.has(status)) {
      // The handler's own business answer: stored and replayed like a success,
      // with the same header allowlist (a problem may carry Set-Cookie too).
      const problem = toProblem(err);
      const headers = { ...this.pickHeaders(problem.headers), 'content-type': PROBLEM_CONTENT_TYPE };
      return this.complete(attempt, { status: problem.status, headers, body: JSON.stringify(problem.body) }, lost);
    }
    return this.release(attempt, lost);
  }

  /**
   * The handler sent its answer itself (through @Res() without passthrough,
   * which IdempotentRoutesValidator refuses at start-up): what went out is not
   * known here, and Nest would not send a replay for such a handler either.
   */
  private notStoredAlreadySent(attempt: Attempt, lost: boolean): Promise<void> {
    this.logger.warn(
      `idempotency: the handler sent its answer itself, so it cannot be stored; key ${attempt.keyHash} released. ` +
        'Use @Res({ passthrough: true }) on @Idempotent() routes.',
    );
    this.metrics.count('not_stored');
    return this.release(attempt, lost);
  }

  private async complete(attempt: Attempt, response: StoredResponse, lost: boolean): Promise<void> {
    const size = Buffer.byteLength(response.body);
    if (size > attempt.settings.maxStoredBodyBytes) {
      this.logger.warn(
        `idempotency: answer of ${size} bytes exceeds ${attempt.settings.maxStoredBodyBytes}; not stored, key ${attempt.keyHash} released`,
      );
      this.metrics.count('not_stored');
      return this.release(attempt, lost);
    }
    try {
      const ours = await this.store.complete(
        attempt.context.operation,
        attempt.token,
        attempt.context.fingerprint,
        response,
        attempt.settings.resultTtlMs,
      );
      if (!ours && !lost) this.lockLost(attempt, 'finalise refused');
    } catch (err) {
      // The answer still goes out; the lock expires and a retry runs again.
      this.metrics.count('store_unavailable');
      this.logger.error(`idempotency: could not store the answer (key ${attempt.keyHash}): ${errorText(err)}`);
    }
  }

  private async release(attempt: Attempt, lost: boolean): Promise<void> {
    this.metrics.count('released');
    try {
      const ours = await this.store.release(attempt.context.operation, attempt.token);
      if (!ours && !lost) this.lockLost(attempt, 'release refused');
    } catch (err) {
      this.logger.error(`idempotency: could not release key ${attempt.keyHash}: ${errorText(err)}`);
    }
  }

  private lockLost(attempt: Attempt, how: string): void {
    this.metrics.count('lock_lost');
    this.logger.warn(
      `idempotency lock lost (${how}) for key ${attempt.keyHash}: the handler outlived its lock; ` +
        'another request may have run it too. Raise the lock TTL if handlers are this slow.',
    );
  }

  private replay(stored: StoredResponse): Response {
    // The allowlist again: the record may have been written by another version
    // (or by hand), and Set-Cookie must never come back from a store.
    const headers = new Headers(this.pickHeaders(stored.headers));
    // The body's own type, even under a custom allowlist that leaves it out:
    // it is stored with every answer, and a body without it is another body.
    const contentType = stored.headers['content-type'];
    if (contentType !== undefined) headers.set('content-type', contentType);
    headers.set('idempotent-replayed', 'true');
    const empty = NULL_BODY_STATUSES.has(stored.status) || stored.body === '';
    if (!empty) headers.set('content-length', String(Buffer.byteLength(stored.body)));
    return new Response(empty ? null : stored.body, { status: stored.status, headers });
  }

  private pickHeaders(all: Readonly<Record<string, number | string | string[] | undefined>>): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [name, value] of Object.entries(all)) {
      const lower = name.toLowerCase();
      if (value === undefined || !this.replayHeaders.has(lower)) continue;
      out[lower] = Array.isArray(value) ? value.join(', ') : String(value);
    }
    return out;
  }

  private settingsFor(route: IdempotentOptions): RouteSettings {
    return {
      required: route.required ?? true,
      lockTtlMs: route.lockTtlMs ?? this.options.lockTtlMs ?? DEFAULT_LOCK_TTL_MS,
      resultTtlMs: route.resultTtlMs ?? this.options.resultTtlMs ?? DEFAULT_RESULT_TTL_MS,
      maxStoredBodyBytes: route.maxStoredBodyBytes ?? this.options.maxStoredBodyBytes ?? DEFAULT_MAX_STORED_BODY_BYTES,
    };
  }
}

function normalisePath(path: string): string {
  return path.length > 1 ? path.replace(/\/+$/, '') : path;
}

const pathFillers = new Map<string, (params: Record<string, string | string[]>) => string>();

/**
 * The path that names the operation: the route's own pattern as it was
 * registered (global prefix included) with its parameters filled in, not the
 * path the client typed. Express matches routes case-insensitively and with
 * or without a trailing slash, so `/V1/SUMMARIES/` runs the handler of
 * `/v1/summaries`; it must also find its record, or one key could run the
 * handler twice. Parameters are decoded by Express and encoded again here
 * (`a%2Fb` stays one segment), so equal parameters always give one path.
 */
function operationPath(req: Request): string {
  const pattern = (req.route as { path?: unknown } | undefined)?.path;
  if (typeof pattern !== 'string') return normalisePath(req.path);
  let fill = pathFillers.get(pattern);
  if (fill === undefined) {
    // path-to-regexp is the parser Express and Nest match this pattern with.
    fill = compile(pattern, { encode: encodeURIComponent });
    pathFillers.set(pattern, fill);
  }
  return normalisePath(fill(req.params as Record<string, string | string[]>));
}

/** The bytes Express will send for a handler's return value, or undefined if it is not storable. */
function serialiseBody(body: unknown): { text: string; contentType: string } | undefined {
  if (body === undefined || body === null) return { text: '', contentType: 'text/plain; charset=utf-8' };
  if (typeof body === 'string') return { text: body, contentType: 'text/html; charset=utf-8' };
  if (typeof body === 'number' || typeof body === 'boolean') {
    return { text: String(body), contentType: 'text/html; charset=utf-8' };
  }
  if (Buffer.isBuffer(body) || isObservable(body) || body instanceof Response || isStream(body)) return undefined;
  if (typeof body === 'object') return { text: JSON.stringify(body), contentType: 'application/json; charset=utf-8' };
  return undefined;
}

function isStream(value: object): boolean {
  return typeof (value as { pipe?: unknown }).pipe === 'function' || Symbol.asyncIterator in value;
}

function typeName(value: unknown): string {
  return typeof value === 'object' && value !== null ? value.constructor.name : typeof value;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
