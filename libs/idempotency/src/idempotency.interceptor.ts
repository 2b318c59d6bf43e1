import { CallHandler, ExecutionContext, Inject, Injectable, Logger, NestInterceptor } from '@nestjs/common';
import { HttpAdapterHost, ModuleRef, Reflector } from '@nestjs/core';
import { isRejectedByPipes } from '@nestjs/core/internal';
import { headerValues, rawBodyOf } from '@app/problem';
import type { Request, Response as ExpressResponse } from 'express';
import { createHash, randomUUID } from 'node:crypto';
import { from, lastValueFrom, map, Observable, of } from 'rxjs';
import {
  type Attempt,
  errorText,
  type InProgress,
  replayHeaderAllowlist,
  type RouteSettings,
  routeSettings,
} from './attempt';
import { AttemptSettler } from './attempt-settler';
import { fingerprintBody, fingerprintDigest, legacyFingerprint, sameFingerprint } from './canonical-json';
import { Follower } from './follower';
import { IdempotencyRequestContext, setIdempotencyContext, setPendingRecord } from './idempotency-context';
import { IDEMPOTENCY_KEY_HEADER, IDEMPOTENCY_SCOPE_HEADER, parseIdempotencyKey } from './idempotency-key';
import {
  IdempotencyInProgressException,
  IdempotencyKeyInvalidException,
  IdempotencyKeyMissingException,
  IdempotencyStoreUnavailableException,
} from './idempotency.errors';
import { IdempotencyMetrics } from './idempotency.metrics';
import { IDEMPOTENCY_MODULE_OPTIONS, type IdempotencyModuleOptions } from './idempotency.module-definition';
import {
  assertValidIdempotentOptions,
  type IdempotencyRecovery,
  IdempotentMetadata,
  type IdempotentOptions,
  type RecoveredAnswer,
} from './idempotent.decorator';
import {
  ClaimResult,
  type IdempotencyFrameLog,
  IdempotencyStore,
  InjectIdempotencyStore,
} from './idempotency-store.interface';
import { operationPath } from './operation-path';
import { pendingRecord } from './pending-record';
import { DirectAnswer, sendsDirectAnswers } from './direct-answer';
import { brokenEnd, NULL_BODY_STATUSES, Replays, withNativeContentType } from './replays';
import { RequestOutcomes } from './request-outcomes';
import { HandlerDurations } from './retry-after';
import { type HandlerOutcome, jsonAnswer, settleDecision } from './settle-decision';
import { StreamRecorder } from './stream-recorder';
import { framesAsBytes, framesResponse, isWebResponse, StreamedAnswer } from './streamed-answer';

export {
  DEFAULT_LOCK_TTL_MS,
  DEFAULT_MAX_STORED_BODY_BYTES,
  DEFAULT_REPLAY_HEADERS,
  DEFAULT_RESULT_TTL_MS,
} from './attempt';
export { MAX_FOLLOWERS } from './follower';

/**
 * Runs every @Idempotent() handler at most once per (scope, method, path,
 * key): the first request claims the key atomically, runs, and stores its
 * answer; a retry with the same body gets that answer replayed, or a 409
 * while the first one runs; the key with another body is a 422. Routes
 * without the decorator pass straight through.
 *
 * This class claims and dispatches; its parts do the rest: the decision
 * (settleDecision), the store's side of it (AttemptSettler), replays and
 * attached streams (Replays), following a running duplicate (Follower), a
 * streamed answer's recording (StreamRecorder).
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger(IdempotencyInterceptor.name);
  private readonly replayHeaders: ReadonlySet<string>;
  private readonly durations = new HandlerDurations();
  private readonly outcomes: RequestOutcomes;
  private readonly settler: AttemptSettler;
  private readonly replays: Replays;
  private readonly follower: Follower;
  private readonly recorder: StreamRecorder;
  /** Each route's settings (null: not idempotent), by controller class and handler. */
  private readonly routes = new WeakMap<object, WeakMap<object, RouteSettings | null>>();

  constructor(
    private readonly reflector: Reflector,
    @InjectIdempotencyStore() private readonly store: IdempotencyStore,
    @Inject(IDEMPOTENCY_MODULE_OPTIONS) private readonly options: IdempotencyModuleOptions,
    metrics: IdempotencyMetrics,
    private readonly moduleRef: ModuleRef,
    private readonly adapterHost: HttpAdapterHost,
  ) {
    const { lockTtlMs, resultTtlMs, maxStoredBodyBytes } = options;
    assertValidIdempotentOptions({ lockTtlMs, resultTtlMs, maxStoredBodyBytes }, 'IdempotencyModule options');
    this.replayHeaders = replayHeaderAllowlist(options);
    this.outcomes = new RequestOutcomes(metrics, this.durations);
    this.settler = new AttemptSettler(metrics);
    this.replays = new Replays(this.replayHeaders, () => sendsDirectAnswers(adapterHost.httpAdapter));
    this.follower = new Follower(this.replays, this.outcomes);
    this.recorder = new StreamRecorder(metrics, this.settler, this.durations);
  }

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    if (context.getType() !== 'http') return next.handle();
    const settings = this.settingsOf(context.getClass(), context.getHandler());
    if (settings === undefined) return next.handle();

    const http = context.switchToHttp();
    const req = http.getRequest<Request>();
    const res = http.getResponse<ExpressResponse>();

    let key: string | undefined;
    let runScope: string | undefined;
    try {
      key = parseIdempotencyKey(headerValues(req, IDEMPOTENCY_KEY_HEADER));
      if (settings.acceptsRunScope) {
        runScope = parseIdempotencyKey(headerValues(req, IDEMPOTENCY_SCOPE_HEADER), 'Idempotency-Scope');
        if (runScope !== undefined && key !== undefined)
          throw new IdempotencyKeyInvalidException(
            'Send Idempotency-Key or Idempotency-Scope, not both: a scope names a run, a key one operation.',
            'Idempotency-Scope',
          );
      }
    } catch (err) {
      this.outcomes.set(req, 'key_invalid');
      throw err;
    }
    if (key === undefined && runScope === undefined) {
      if (!settings.required)
        return next
          .handle()
          .pipe(map((value: unknown) => withNativeContentType(res, this.unrecorded(value, settings))));
      this.outcomes.set(req, 'key_invalid');
      throw new IdempotencyKeyMissingException();
    }

    const scope = this.options.scope(req);
    const method = req.method.toUpperCase();
    const path = operationPath(req);
    // From the bytes as sent where the JSON parser kept them: numbers as written, not as doubles.
    const fingerprint = fingerprintBody(req.body, rawBodyOf(req));
    // Under a run's scope, each distinct body is an operation of its own. A key never holds a comma, so no key
    // names the same operation as a scope's request.
    const operationKey = runScope === undefined ? key! : `${runScope},${fingerprintDigest(fingerprint)}`;
    const ctx: IdempotencyRequestContext = {
      key: operationKey,
      ...(runScope === undefined ? {} : { runScope }),
      scope,
      method,
      path,
      fingerprint,
      operation: `${scope}:${method}:${path}:${operationKey}`,
    };
    setIdempotencyContext(req, ctx);
    // Computed only for a record written before fingerprints were versioned.
    let legacy: string | undefined;
    const attempt: Attempt = {
      context: ctx,
      token: randomUUID(),
      settings,
      // Hashed only when a log line names it: most requests never log one.
      get keyHash() {
        return createHash('sha256').update(ctx.operation).digest('hex').slice(0, 16);
      },
      handler: context.getHandler(),
      sameBody: (stored) => sameFingerprint(stored, ctx.fingerprint, () => (legacy ??= legacyFingerprint(req.body))),
    };

    let claim: ClaimResult;
    try {
      claim = await settings.store.claim(ctx.operation, attempt.token, ctx.fingerprint, settings.lockTtlMs);
    } catch (err) {
      this.outcomes.set(req, 'store_unavailable');
      this.logger.warn(`idempotency store unavailable, refusing ${method} ${path}: ${errorText(err)}`);
      throw new IdempotencyStoreUnavailableException();
    }

    switch (claim.outcome) {
      case 'completed':
        if (!attempt.sameBody(claim.fingerprint)) return this.outcomes.mismatch(req);
        this.outcomes.set(req, 'replayed');
        return of(withNativeContentType(res, this.replays.stored(claim.response, settings.store.frames, settings)));
      case 'in-progress':
        if (!attempt.sameBody(claim.fingerprint)) return this.outcomes.mismatch(req);
        if (settings.attachWaitMs !== undefined && settings.store.frames && claim.frames && this.follower.hasRoom) {
          return from(this.followThenRun(settings.store.frames, claim, next, req, res, attempt)).pipe(
            map((v) => withNativeContentType(res, v)),
          );
        }
        return this.outcomes.inProgress(req, claim, attempt);
      case 'claimed':
        if (claim.tookOver && settings.recover) {
          return from(this.recoverThenRun(settings.recover, next, req, res, attempt)).pipe(
            map((v) => withNativeContentType(res, v)),
          );
        }
        this.outcomes.set(req, 'new');
        // Subscribed here, not by the caller: the handler's outcome is recorded
        // even if the client goes away meanwhile, so the key is never released
        // under a handler that is still running.
        return from(this.run(next, req, res, attempt).then((v) => withNativeContentType(res, v)));
    }
  }

  /** The route's settings, undefined without @Idempotent(): read from its metadata once per class and method. */
  private settingsOf(controller: object, handler: object): RouteSettings | undefined {
    let byHandler = this.routes.get(controller);
    if (!byHandler) this.routes.set(controller, (byHandler = new WeakMap()));
    if (byHandler.has(handler)) return byHandler.get(handler) ?? undefined;
    const route = this.reflector.getAllAndOverride<IdempotentOptions | undefined>(IdempotentMetadata, [
      handler as () => void,
      controller as () => void,
    ]);
    const settings = route && routeSettings(route, this.options, this.store, this.replayHeaders);
    byHandler.set(handler, settings ?? null);
    return settings;
  }

  /**
   * A duplicate of a running request follows it (Follower); if the key was
   * freed meanwhile, this request runs, as a first request would (errors of
   * the handler are its own, not the store's), recovering first if the one it
   * followed died.
   */
  private async followThenRun(
    log: IdempotencyFrameLog,
    first: InProgress,
    next: CallHandler,
    req: Request,
    res: ExpressResponse,
    attempt: Attempt,
  ): Promise<unknown> {
    const followed = await this.follower.follow(log, first, req, res, attempt);
    if (followed.kind === 'answer') return followed.value;
    const { recover } = attempt.settings;
    if (followed.tookOver && recover) return this.recoverThenRun(recover, next, req, res, attempt);
    this.outcomes.set(req, 'new');
    return this.run(next, req, res, attempt);
  }

  /**
   * The key's earlier request died holding it: its effect may have happened.
   * The route's recovery looks up what it really did; an answer found is
   * stored and sent as the handler's would be, and the handler does not run.
   * Nothing found: the handler runs. The recovery failing (the outcome cannot
   * be known yet) frees the key, and its error is the answer.
   */
  private async recoverThenRun(
    recovery: NonNullable<RouteSettings['recover']>,
    next: CallHandler,
    req: Request,
    res: ExpressResponse,
    attempt: Attempt,
  ): Promise<unknown> {
    // The lookup may take a while (a provider's timeout): the lock is renewed meanwhile.
    const pending = pendingRecord(attempt);
    const lease = this.settler.lease(attempt, () => pending.completing);
    let answer: RecoveredAnswer | undefined;
    try {
      const hook = this.moduleRef.get<unknown, IdempotencyRecovery>(recovery, { strict: false });
      answer = await hook.recover(attempt.context, req, pending.record);
    } catch (error) {
      lease.stop();
      await this.settler.settle(attempt, lease, settleDecision({ kind: 'recovery-failed', error }, attempt.settings));
      throw error;
    }
    lease.stop();
    const completedWithin = pending.completed();
    if (completedWithin) {
      // The recovery recorded what it found in its own transaction, answer included: that is the answer.
      this.outcomes.set(req, 'recovered');
      return this.replays.answer(completedWithin);
    }
    if (lease.lost) {
      // Another request took the key over while this one looked: it is that one's now.
      this.outcomes.set(req, 'in_progress');
      throw new IdempotencyInProgressException(1);
    }
    if (answer === undefined) {
      this.outcomes.set(req, 'new');
      return this.run(next, req, res, attempt);
    }
    this.outcomes.set(req, 'recovered');
    const stored = jsonAnswer(answer, attempt.settings.replayHeaders);
    await this.settler.settle(
      attempt,
      lease,
      settleDecision({ kind: 'recovered', response: stored }, attempt.settings),
    );
    return this.replays.answer(stored);
  }

  private async run(next: CallHandler, req: Request, res: ExpressResponse, attempt: Attempt): Promise<unknown> {
    const pending = pendingRecord(attempt);
    const lease = this.settler.lease(attempt, () => pending.completing);
    const started = performance.now();
    setPendingRecord(req, pending.record);
    let body: unknown;
    try {
      body = await lastValueFrom(next.handle(), { defaultValue: undefined });
    } catch (error) {
      lease.stop();
      const rejectedByPipes = isRejectedByPipes(req);
      // A body the pipes refused never ran the handler: its milliseconds say nothing of a run.
      if (!rejectedByPipes) this.durations.record(attempt.handler, performance.now() - started);
      const outcome = { kind: 'threw', error, rejectedByPipes, headersSent: res.headersSent } as const;
      await this.settler.settle(attempt, lease, settleDecision(outcome, attempt.settings));
      throw error;
    }
    const completedWithin = pending.completed();
    if (completedWithin) {
      // Stored with the handler's own transaction: nothing more to store, and
      // what is sent is exactly what was stored, so the first answer and its
      // replays are one.
      lease.stop();
      this.durations.record(attempt.handler, performance.now() - started);
      return this.replays.answer(completedWithin);
    }
    if (body instanceof StreamedAnswer) return this.recorder.record(body, res, attempt, lease, started);
    lease.stop();
    this.durations.record(attempt.handler, performance.now() - started);
    const outcome =
      body instanceof DirectAnswer
        ? directAnswerOutcome(body, attempt.settings)
        : isWebResponse(body)
          ? await webResponseOutcome(body, attempt.settings)
          : ({
              kind: 'returned',
              body,
              status: res.statusCode,
              headers: res.getHeaders(),
              headersSent: res.headersSent,
            } satisfies HandlerOutcome);
    const decision = settleDecision(outcome, attempt.settings);
    await this.settler.settle(attempt, lease, decision);
    // An answer that cannot be sent either: its error is the answer, for the exception filter.
    const { reason } = decision.action === 'release' ? decision : { reason: undefined };
    if (reason?.kind === 'unserialisable' || reason?.kind === 'unreadable') throw reason.error;
    if (outcome.kind === 'web-response' && outcome.bytes !== undefined && isWebResponse(body)) {
      // Its body was read to be stored: what is sent is what was read.
      const bytes = NULL_BODY_STATUSES.has(body.status) ? null : outcome.bytes;
      return new Response(bytes, { status: body.status, headers: body.headers });
    }
    if (decision.action === 'store' && outcome.kind === 'returned' && body !== undefined && body !== null) {
      // Sent as it was stored (where the app sends direct answers): the bytes
      // serialised once, and the first answer and its replays are one.
      const answer = this.replays.answer(decision.response);
      if (!isWebResponse(answer)) return answer;
    }
    return this.sendable(body);
  }

  /**
   * A handler's own DirectAnswer, as this app's adapter can send it: as it is with DirectAnswerExpressAdapter,
   * else as the web Response it stands for (Nest's own adapter would try to pipe it).
   */
  private sendable(value: unknown): unknown {
    if (!(value instanceof DirectAnswer) || sendsDirectAnswers(this.adapterHost.httpAdapter)) return value;
    const body = NULL_BODY_STATUSES.has(value.status) ? null : value.body;
    return new Response(body, { status: value.status, headers: value.headers });
  }

  /** A value for a caller without a key: a streamed answer is sent as it is, unrecorded. */
  private unrecorded(value: unknown, settings: RouteSettings): unknown {
    if (!(value instanceof StreamedAnswer)) return this.sendable(value);
    const answer = value;
    const logger = this.logger;
    async function* frames(): AsyncGenerator<Buffer> {
      try {
        yield* framesAsBytes(answer.frames);
      } catch (err) {
        logger.warn(`a streamed answer broke before its end: ${errorText(err)}`);
        // One body in pieces: cut, so its caller sees a truncated transfer rather than a frame appended to it.
        if (!settings.errors || !answer.framed) throw err;
        yield* brokenEnd(settings);
      }
    }
    return framesResponse(answer.status, new Headers(answer.headers), frames());
  }
}

/**
 * A handler's DirectAnswer (a whole answer whose bytes it already holds, as the gateway's relay returns) as the
 * decision needs it: the web Response's outcome without a stream to read. It is sent as it is (or as the web
 * Response it stands for, see `sendable`), and what is sent is what is stored.
 */
function directAnswerOutcome(answer: DirectAnswer, settings: RouteSettings): HandlerOutcome {
  const headers = { ...answer.headers };
  if (!settings.storesStatus(answer.status)) return { kind: 'web-response', status: answer.status, headers };
  return { kind: 'web-response', status: answer.status, headers, bytes: answer.body ?? Buffer.alloc(0) };
}

/**
 * A handler's web Response as the decision needs it: its body is read only
 * when the route stores its status; one it does not store is sent as it is,
 * unread (a stream or binary body passes through untouched). Read as bytes,
 * not text: a body that is not UTF-8 (a provider's, relayed) is stored and
 * sent as it came, never with U+FFFD in place of what it held.
 */
async function webResponseOutcome(response: Response, settings: RouteSettings): Promise<HandlerOutcome> {
  const headers = Object.fromEntries(response.headers);
  if (!settings.storesStatus(response.status)) return { kind: 'web-response', status: response.status, headers };
  try {
    const bytes = Buffer.from(await response.arrayBuffer());
    return { kind: 'web-response', status: response.status, headers, bytes };
  } catch (error) {
    return { kind: 'web-response-unreadable', error };
  }
}
