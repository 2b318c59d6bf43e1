import {
  CallHandler,
  ExecutionContext,
  HttpException,
  Inject,
  Injectable,
  Logger,
  NestInterceptor,
} from '@nestjs/common';
import { ModuleRef, Reflector } from '@nestjs/core';
import { isRejectedByPipes } from '@nestjs/core/internal';
import type { Request, Response as ExpressResponse } from 'express';
import { createHash, randomUUID } from 'node:crypto';
import { compile } from 'path-to-regexp';
import { lastValueFrom, map, Observable, of, from } from 'rxjs';
import { fingerprintBody } from './canonical-json';
import {
  IdempotencyLockLostError,
  IdempotencyRequestContext,
  type IdempotencyRequestOutcome,
  type PendingIdempotencyRecord,
  setIdempotencyContext,
  setIdempotencyOutcome,
  setPendingRecord,
} from './idempotency-context';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from './idempotency-key';
import {
  IdempotencyInProgressException,
  IdempotencyKeyMissingException,
  IdempotencyKeyReusedException,
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
  type FrameEvent,
  type FramesRef,
  type IdempotencyFrameLog,
  IdempotencyStore,
  InjectIdempotencyStore,
  StoredResponse,
} from './idempotency-store.interface';
import { LockLease } from './lock-lease';
import { HandlerDurations, retryAfterSeconds } from './retry-after';
import {
  type HandlerOutcome,
  jsonAnswer,
  pickHeaders,
  type ReleaseReason,
  type SettleDecision,
  settleDecision,
  type SettleRoute,
  storesByDefault,
} from './settle-decision';
import { FrameChannel, framesResponse, isWebResponse, onceClosed, StreamedAnswer } from './streamed-answer';

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

/** Duplicates following running requests in this process, at most; more get the 409. */
export const MAX_FOLLOWERS = 1000;
/** A re-claim after a followed request ended finds it settled; a few rounds cover a takeover race. */
const MAX_FOLLOW_ROUNDS = 4;

interface RouteSettings extends SettleRoute {
  readonly required: boolean;
  readonly lockTtlMs: number;
  readonly resultTtlMs: number;
  readonly attachWaitMs: number | undefined;
  readonly store: IdempotencyStore;
  readonly recover: IdempotentOptions['recover'];
}

type InProgress = Extract<ClaimResult, { outcome: 'in-progress' }>;

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
    private readonly moduleRef: ModuleRef,
  ) {
    const { lockTtlMs, resultTtlMs, maxStoredBodyBytes } = options;
    assertValidIdempotentOptions({ lockTtlMs, resultTtlMs, maxStoredBodyBytes }, 'IdempotencyModule options');
    this.replayHeaders = new Set(
      (options.replayHeaders ?? DEFAULT_REPLAY_HEADERS)
        .map((h) => h.toLowerCase())
        .filter((h) => !NEVER_REPLAYED.has(h)),
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
      this.outcome(req, 'key_invalid');
      throw err;
    }
    if (key === undefined) {
      if (!settings.required)
        return next
          .handle()
          .pipe(map((value: unknown) => withNativeContentType(res, this.unrecorded(value, settings))));
      this.outcome(req, 'key_invalid');
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
      claim = await settings.store.claim(ctx.operation, attempt.token, ctx.fingerprint, settings.lockTtlMs);
    } catch (err) {
      this.outcome(req, 'store_unavailable');
      this.logger.warn(`idempotency store unavailable, refusing ${method} ${path}: ${errorText(err)}`);
      throw new IdempotencyStoreUnavailableException();
    }

    switch (claim.outcome) {
      case 'completed':
        if (claim.fingerprint !== ctx.fingerprint) return this.mismatch(req);
        this.outcome(req, 'replayed');
        return of(withNativeContentType(res, this.replay(claim.response, settings.store.frames, settings)));
      case 'in-progress':
        if (claim.fingerprint !== ctx.fingerprint) return this.mismatch(req);
        if (
          settings.attachWaitMs !== undefined &&
          settings.store.frames &&
          claim.frames &&
          this.followers < MAX_FOLLOWERS
        ) {
          return from(this.follow(settings.store.frames, claim, next, req, res, attempt)).pipe(
            map((v) => withNativeContentType(res, v)),
          );
        }
        return this.inProgress(req, claim, attempt);
      case 'claimed':
        if (claim.tookOver && settings.recover) {
          return from(this.recoverThenRun(settings.recover, next, req, res, attempt)).pipe(
            map((v) => withNativeContentType(res, v)),
          );
        }
        this.outcome(req, 'new');
        // Subscribed here, not by the caller: the handler's outcome is recorded
        // even if the client goes away meanwhile, so the key is never released
        // under a handler that is still running.
        return from(this.run(next, req, res, attempt)).pipe(map((v) => withNativeContentType(res, v)));
    }
  }

  private followers = 0;

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
    const pending = this.pendingRecord(attempt);
    const lease = this.leaseFor(attempt, () => pending.completing);
    let answer: RecoveredAnswer | undefined;
    try {
      const hook = this.moduleRef.get<unknown, IdempotencyRecovery>(recovery, { strict: false });
      answer = await hook.recover(attempt.context, req, pending.record);
    } catch (error) {
      lease.stop();
      await this.settle(attempt, lease, settleDecision({ kind: 'recovery-failed', error }, attempt.settings));
      throw error;
    }
    lease.stop();
    const completedWithin = pending.completed();
    if (completedWithin) {
      // The recovery recorded what it found in its own transaction, answer included: that is the answer.
      this.outcome(req, 'recovered');
      return asResponse(completedWithin);
    }
    if (lease.lost) {
      // Another request took the key over while this one looked: it is that one's now.
      this.outcome(req, 'in_progress');
      throw new IdempotencyInProgressException(1);
    }
    if (answer === undefined) {
      this.outcome(req, 'new');
      return this.run(next, req, res, attempt);
    }
    this.outcome(req, 'recovered');
    const stored = jsonAnswer(answer, attempt.settings.replayHeaders);
    await this.settle(attempt, lease, settleDecision({ kind: 'recovered', response: stored }, attempt.settings));
    return asResponse(stored);
  }

  /** Renews the attempt's lock while it runs; `quiet()` true: a refused renewal is expected (the record was completed in a transaction). */
  private leaseFor(attempt: Attempt, quiet?: () => boolean): LockLease {
    return new LockLease(
      attempt.settings.store,
      attempt.context.operation,
      attempt.token,
      attempt.settings.lockTtlMs,
      (how) => this.lockLost(attempt, how),
      (err) => this.logger.warn(`idempotency lock renewal failed (key ${attempt.keyHash}): ${errorText(err)}`),
      quiet,
    );
  }

  private outcome(req: Request, outcome: IdempotencyRequestOutcome): void {
    this.metrics.count(outcome);
    setIdempotencyOutcome(req, outcome);
  }

  private inProgress(req: Request, claim: InProgress, attempt: Attempt): never {
    this.outcome(req, 'in_progress');
    throw new IdempotencyInProgressException(retryAfterSeconds(claim, this.durations.typical(attempt.handler)));
  }

  /**
   * A duplicate of a running request: follows it, on whichever instance it
   * runs, until its answer starts (attached: its frames so far, then the live
   * ones) or it ends (claimed again: its stored answer, or the key is free and
   * this request runs it). Waits at most the route's `attach.waitMs` for
   * either, then answers 409 as an unattached duplicate would.
   */
  private async follow(
    log: IdempotencyFrameLog,
    first: InProgress,
    next: CallHandler,
    req: Request,
    res: ExpressResponse,
    attempt: Attempt,
  ): Promise<unknown> {
    const { context: ctx, settings } = attempt;
    this.followers++;
    let left = false;
    const leave = (): void => {
      if (left) return;
      left = true;
      this.followers--;
    };
    let handedOver = false;
    // The caller going away ends the following (and its place among the
    // followers, even if its stream was never read); the running request goes on.
    const gone = new AbortController();
    onceClosed(res, () => {
      gone.abort();
      leave();
    });
    let runIt = false;
    let tookOver = false;
    try {
      let claim: ClaimResult = first;
      for (let round = 0; round < MAX_FOLLOW_ROUNDS; round++) {
        if (claim.outcome === 'completed') {
          if (claim.fingerprint !== ctx.fingerprint) return this.mismatch(req);
          this.outcome(req, 'attached');
          return this.replay(claim.response, log, settings);
        }
        if (claim.outcome === 'claimed') {
          runIt = true;
          tookOver = claim.tookOver === true;
          break;
        }
        if (claim.fingerprint !== ctx.fingerprint) return this.mismatch(req);
        if (!claim.frames) return this.inProgress(req, claim, attempt);
        const waiting = new AbortController();
        const timer = setTimeout(() => waiting.abort(), settings.attachWaitMs);
        const events = log.follow(claim.frames, AbortSignal.any([gone.signal, waiting.signal]))[Symbol.asyncIterator]();
        let firstEvent: IteratorResult<FrameEvent>;
        try {
          firstEvent = await events.next();
        } finally {
          clearTimeout(timer);
        }
        if (firstEvent.done) {
          if (gone.signal.aborted) return undefined; // nobody to answer
          return this.inProgress(req, claim, attempt);
        }
        if (firstEvent.value.kind === 'head') {
          this.outcome(req, 'attached');
          handedOver = true;
          // Only the caller going away stops it from here; the waiting timer is cleared.
          return this.attached(firstEvent.value.head, events, settings, leave);
        }
        // It ended without streaming (a whole answer, or freed), or died: look again.
        await events.return?.();
        claim = await settings.store.claim(ctx.operation, attempt.token, ctx.fingerprint, settings.lockTtlMs);
      }
      if (!runIt) return this.inProgress(req, first, attempt);
    } catch (err) {
      if (err instanceof HttpException) throw err;
      this.outcome(req, 'store_unavailable');
      this.logger.warn(`idempotency: following a running request failed (key ${attempt.keyHash}): ${errorText(err)}`);
      throw new IdempotencyStoreUnavailableException();
    } finally {
      if (!handedOver) leave();
    }
    // The key was freed while this one followed: it runs, as a first request
    // would (errors of the handler are its own, not the store's), recovering
    // first if the one it followed died.
    if (tookOver && settings.recover) return this.recoverThenRun(settings.recover, next, req, res, attempt);
    this.outcome(req, 'new');
    return this.run(next, req, res, attempt);
  }

  /** The running answer's frames, from the first, as a response that ends as that answer ends. */
  private attached(
    head: { status: number; headers: Readonly<Record<string, string>> },
    events: AsyncIterator<FrameEvent>,
    settings: RouteSettings,
    done: () => void,
  ): Response {
    const headers = this.replayHeadersOf(head);
    const logger = this.logger;
    async function* frames(): AsyncGenerator<string> {
      try {
        for (;;) {
          const step = await events.next();
          if (step.done) return; // the caller went away
          const event = step.value;
          if (event.kind === 'frame') yield event.data;
          else if (event.kind === 'end' && event.outcome === 'completed') return;
          else if (event.kind === 'end' || event.kind === 'gone') {
            yield* brokenEnd(settings);
            return;
          }
        }
      } catch (err) {
        logger.warn(`idempotency: following a streamed answer failed: ${errorText(err)}`);
        yield* brokenEnd(settings);
      } finally {
        done();
        await events.return?.();
      }
    }
    return framesResponse(head.status, headers, frames(), () => {
      done();
      void events.return?.();
    });
  }

  private mismatch(req: Request): never {
    this.outcome(req, 'mismatch');
    throw new IdempotencyKeyReusedException();
  }

  /**
   * The attempt's record as a handler (or a recovery) finalises it inside its
   * own transaction. `completing` is true from the moment it writes the
   * answer: a renewal may then wait on the transaction's row lock and find
   * the record completed, a refusal that is expected, not a lost lock.
   * `completed()` is what was stored, once the call returned.
   */
  private pendingRecord(attempt: Attempt): {
    record: PendingIdempotencyRecord;
    readonly completing: boolean;
    completed(): StoredResponse | undefined;
  } {
    let completing = false;
    let completedWithin: StoredResponse | undefined;
    const record: PendingIdempotencyRecord = {
      completeWithin: async (tx, answer) => {
        const store = attempt.settings.store;
        if (!store.completeWithin)
          throw new Error(
            "Idempotency: this route's store cannot finalise inside a transaction (use a PostgreSQL store)",
          );
        if (!attempt.settings.storesStatus(answer.status))
          throw new Error(
            `Idempotency: a ${answer.status} answer is not stored on this route; finalise only answers it stores`,
          );
        const stored = jsonAnswer(answer, attempt.settings.replayHeaders);
        if (Buffer.byteLength(stored.body) > attempt.settings.maxStoredBodyBytes)
          throw new Error("Idempotency: the answer is over the route's maxStoredBodyBytes");
        completing = true;
        const ours = await store.completeWithin(
          tx,
          attempt.context.operation,
          attempt.token,
          attempt.context.fingerprint,
          stored,
          attempt.settings.resultTtlMs,
        );
        // Refused: another request holds the key now. Throwing rolls the effect back with it.
        if (!ours) {
          completing = false;
          throw new IdempotencyLockLostError();
        }
        // May be called again if the transaction is retried: the last call is the answer.
        completedWithin = stored;
      },
    };
    return {
      record,
      get completing() {
        return completing;
      },
      completed: () => completedWithin,
    };
  }

  private async run(next: CallHandler, req: Request, res: ExpressResponse, attempt: Attempt): Promise<unknown> {
    const pending = this.pendingRecord(attempt);
    const lease = this.leaseFor(attempt, () => pending.completing);
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
      await this.settle(attempt, lease, settleDecision(outcome, attempt.settings));
      throw error;
    }
    const completedWithin = pending.completed();
    if (completedWithin) {
      // Stored with the handler's own transaction: nothing more to store, and
      // what is sent is exactly what was stored, so the first answer and its
      // replays are one.
      lease.stop();
      this.durations.record(attempt.handler, performance.now() - started);
      return asResponse(completedWithin);
    }
    if (body instanceof StreamedAnswer) return this.record(body, res, attempt, lease, started);
    lease.stop();
    this.durations.record(attempt.handler, performance.now() - started);
    const outcome = isWebResponse(body)
      ? await webResponseOutcome(body, attempt.settings)
      : ({
          kind: 'returned',
          body,
          status: res.statusCode,
          headers: res.getHeaders(),
          headersSent: res.headersSent,
        } satisfies HandlerOutcome);
    const decision = settleDecision(outcome, attempt.settings);
    await this.settle(attempt, lease, decision);
    // An answer that cannot be sent either: its error is the answer, for the exception filter.
    const { reason } = decision.action === 'release' ? decision : { reason: undefined };
    if (reason?.kind === 'unserialisable' || reason?.kind === 'unreadable') throw reason.error;
    if (outcome.kind === 'web-response' && outcome.text !== undefined && isWebResponse(body)) {
      // Its body was read to be stored: what is sent is what was read.
      const text = NULL_BODY_STATUSES.has(body.status) ? null : outcome.text;
      return new Response(text, { status: body.status, headers: body.headers });
    }
    return body;
  }

  /**
   * A streamed answer: each frame goes to the caller and to the store as it
   * comes (appends batched, one in flight at a time, so the store never
   * holds the answer back), and the record is complete, or freed, before the
   * caller's stream ends. The frames are read here, not by the caller: one
   * who goes away stops nothing, and the answer is stored for its retry.
   */
  private record(
    answer: StreamedAnswer,
    res: ExpressResponse,
    attempt: Attempt,
    lease: LockLease,
    started: number,
  ): Response {
    const { context: ctx, settings } = attempt;
    const headers = pickHeaders(answer.headers, this.replayHeaders);
    const contentType = Object.entries(answer.headers).find(([name]) => name.toLowerCase() === 'content-type')?.[1];
    if (contentType !== undefined) headers['content-type'] = contentType;
    // While stored, the whole answer fits the channel: the caller never holds
    // the recording back. One too large to store is paced by its caller (a
    // caller that stalls is cut); one that went away, even before its stream
    // was first read, is dropped.
    const channel = new FrameChannel(Math.max(4 * 1024 * 1024, settings.maxStoredBodyBytes), () => {
      this.logger.warn(
        `idempotency: a caller read nothing of a streamed answer for 30 s and was cut (key ${attempt.keyHash})`,
      );
      res.destroy();
    });
    onceClosed(res, () => channel.detach());
    const log = settings.store.frames;
    let storing = settings.storesStatus(answer.status) && log !== undefined;
    let settled = false;
    let pending: string[] = [];
    let inFlight: Promise<void> | undefined;
    let began: Promise<boolean> | undefined;
    let beginFailed = false;
    let releasing: Promise<void> | undefined;
    let size = 0;

    const stopStoring = (why: string | undefined): Promise<void> => {
      storing = false;
      lease.stop();
      if (why) {
        this.logger.warn(`idempotency: ${why}; not stored, key ${attempt.keyHash} released`);
        this.metrics.count('not_stored');
      }
      if (!settled) {
        settled = true;
        releasing = this.release(attempt, lease);
      }
      return releasing ?? Promise.resolve();
    };
    const flush = (): void => {
      if (!storing || inFlight || pending.length === 0 || !log) return;
      const batch = pending;
      pending = [];
      inFlight = (async () => {
        try {
          if (!(await began) || !(await log.append(ctx.operation, attempt.token, batch))) {
            // Refused: the lock is not ours any more, unless we stopped storing ourselves meanwhile.
            if (storing && !beginFailed) lease.refused('append refused');
            storing = false;
          }
        } catch (err) {
          this.metrics.count('store_unavailable');
          this.logger.error(`idempotency: could not store the frames (key ${attempt.keyHash}): ${errorText(err)}`);
          await stopStoring(undefined);
        } finally {
          inFlight = undefined;
          flush();
        }
      })();
    };
    const drained = async (): Promise<void> => {
      while (inFlight) await inFlight;
    };

    if (!log && settings.storesStatus(answer.status)) {
      this.logger.warn(
        `idempotency: the store keeps no frames, so a streamed answer is not stored; key ${attempt.keyHash} released`,
      );
      this.metrics.count('not_stored');
    }
    if (storing && log) {
      began = log.begin(ctx.operation, attempt.token, { status: answer.status, headers }).catch((err: unknown) => {
        beginFailed = true;
        this.metrics.count('store_unavailable');
        this.logger.error(`idempotency: could not store the frames (key ${attempt.keyHash}): ${errorText(err)}`);
        return false;
      });
    }

    const pump = async (): Promise<void> => {
      let broken: unknown;
      try {
        for await (const frame of answer.frames) {
          if (storing) {
            size += Buffer.byteLength(frame);
            if (size > settings.maxStoredBodyBytes) {
              void stopStoring(`a streamed answer exceeds ${settings.maxStoredBodyBytes} bytes`);
            } else {
              pending.push(frame);
              flush();
            }
          }
          await channel.push(frame);
        }
      } catch (err) {
        broken = err ?? new Error('the stream broke');
      }
      lease.stop();
      await drained();
      await releasing;
      if (broken === undefined && storing && log && (await began)) {
        try {
          settled = true;
          const ours = await log.complete(ctx.operation, attempt.token, ctx.fingerprint, settings.resultTtlMs);
          if (!ours) lease.refused('finalise refused');
        } catch (err) {
          this.metrics.count('store_unavailable');
          this.logger.error(`idempotency: could not store the answer (key ${attempt.keyHash}): ${errorText(err)}`);
        }
      } else if (!settled) {
        settled = true;
        await this.release(attempt, lease);
      }
      this.durations.record(attempt.handler, performance.now() - started);
      if (broken !== undefined) {
        this.logger.warn(
          `idempotency: a streamed answer broke before its end (key ${attempt.keyHash}): ${errorText(broken)}`,
        );
        for (const frame of brokenEnd(settings)) await channel.push(frame);
        if (!settings.errors) {
          channel.fail(broken);
          return;
        }
      }
      channel.end();
    };
    void pump();
    return framesResponse(answer.status, new Headers(answer.headers), channel, () => channel.detach());
  }

  /** A value for a caller without a key: a streamed answer is sent as it is, unrecorded. */
  private unrecorded(value: unknown, settings: RouteSettings): unknown {
    if (!(value instanceof StreamedAnswer)) return value;
    const answer = value;
    const logger = this.logger;
    async function* frames(): AsyncGenerator<string> {
      try {
        yield* answer.frames;
      } catch (err) {
        logger.warn(`a streamed answer broke before its end: ${errorText(err)}`);
        if (!settings.errors) throw err;
        yield settings.errors.brokenStreamFrame();
      }
    }
    return framesResponse(answer.status, new Headers(answer.headers), frames());
  }

  /** Performs what settleDecision decided for the attempt's key: stores the answer, releases the key, or abandons it. */
  private settle(attempt: Attempt, lease: LockLease, decision: SettleDecision): Promise<void> {
    switch (decision.action) {
      case 'store':
        return this.complete(attempt, lease, decision.response);
      case 'abandon':
        return this.abandon(attempt, lease);
      case 'release':
        this.notStored(attempt, decision.reason);
        return this.release(attempt, lease);
    }
  }

  /**
   * An answer that could have been stored but is not: a warning and a
   * `not_stored`. The other releases (a status the route does not store, a
   * refused body, a reused key) are what the route asked for: said nowhere.
   */
  private notStored(attempt: Attempt, reason: ReleaseReason): void {
    const key = attempt.keyHash;
    switch (reason.kind) {
      case 'headers-sent':
        // Through @Res() without passthrough, which IdempotentRoutesValidator
        // refuses at start-up: Nest would not send a replay for such a handler either.
        this.logger.warn(
          `idempotency: the handler sent its answer itself, so it cannot be stored; key ${key} released. ` +
            'Use @Res({ passthrough: true }) on @Idempotent() routes.',
        );
        break;
      case 'too-large':
        this.logger.warn(
          `idempotency: answer of ${reason.size} bytes exceeds ${reason.limit}; not stored, key ${key} released`,
        );
        break;
      case 'unserialisable':
        // A value JSON cannot hold: a bug in the handler that Express could not
        // send either. The exception filter answers 500 with this error (and
        // logs it); the key must not stay locked for the lock TTL meanwhile.
        this.logger.warn(
          `idempotency: the answer cannot be serialised (${errorText(reason.error)}); not stored, key ${key} released`,
        );
        break;
      case 'unstorable':
        this.logger.warn(`idempotency: a ${reason.type} answer cannot be stored; key ${key} released`);
        break;
      case 'status':
      case 'rejected-by-pipes':
      case 'key-reused':
      case 'unreadable':
        return;
    }
    this.metrics.count('not_stored');
  }

  private async complete(attempt: Attempt, lease: LockLease, response: StoredResponse): Promise<void> {
    try {
      const ours = await attempt.settings.store.complete(
        attempt.context.operation,
        attempt.token,
        attempt.context.fingerprint,
        response,
        attempt.settings.resultTtlMs,
      );
      if (!ours) lease.refused('finalise refused');
    } catch (err) {
      // The answer still goes out; the lock expires and a retry runs again.
      this.metrics.count('store_unavailable');
      this.logger.error(`idempotency: could not store the answer (key ${attempt.keyHash}): ${errorText(err)}`);
    }
  }

  private async release(attempt: Attempt, lease: LockLease): Promise<void> {
    this.metrics.count('released');
    try {
      const ours = await attempt.settings.store.release(attempt.context.operation, attempt.token);
      if (!ours) lease.refused('release refused');
    } catch (err) {
      this.logger.error(`idempotency: could not release key ${attempt.keyHash}: ${errorText(err)}`);
    }
  }

  /** Gives the key up as a request whose outcome is unknown: abandoned where the store can mark it (tookOver for the next), else released. */
  private async abandon(attempt: Attempt, lease: LockLease): Promise<void> {
    const store = attempt.settings.store;
    if (!store.abandon) return this.release(attempt, lease);
    this.metrics.count('released');
    try {
      const ours = await store.abandon(attempt.context.operation, attempt.token);
      if (!ours) lease.refused('abandon refused');
    } catch (err) {
      this.logger.error(`idempotency: could not give up key ${attempt.keyHash}: ${errorText(err)}`);
    }
  }

  private lockLost(attempt: Attempt, how: string): void {
    this.metrics.count('lock_lost');
    this.logger.warn(
      `idempotency lock lost (${how}) for key ${attempt.keyHash}: the handler outlived its lock; ` +
        'another request may have run it too. Raise the lock TTL if handlers are this slow.',
    );
  }

  private replay(stored: StoredResponse, log: IdempotencyFrameLog | undefined, settings: RouteSettings): Response {
    const headers = this.replayHeadersOf(stored);
    if (stored.frames) return this.replayFrames(stored, stored.frames, headers, log, settings);
    const empty = NULL_BODY_STATUSES.has(stored.status) || stored.body === '';
    if (!empty) headers.set('content-length', String(Buffer.byteLength(stored.body)));
    return new Response(empty ? null : stored.body, { status: stored.status, headers });
  }

  private replayHeadersOf(stored: { readonly headers: Readonly<Record<string, string>> }): Headers {
    // The allowlist again: the record may have been written by another version
    // (or by hand), and Set-Cookie must never come back from a store.
    const headers = new Headers(pickHeaders(stored.headers, this.replayHeaders));
    // The body's own type, even under a custom allowlist that leaves it out:
    // it is stored with every answer, and a body without it is another body.
    const contentType = stored.headers['content-type'];
    if (contentType !== undefined) headers.set('content-type', contentType);
    headers.set('idempotent-replayed', 'true');
    return headers;
  }

  /** A stored streamed answer, frame by frame as it is read from the store, never whole in memory. */
  private replayFrames(
    stored: StoredResponse,
    ref: FramesRef,
    headers: Headers,
    log: IdempotencyFrameLog | undefined,
    settings: RouteSettings,
  ): Response {
    const logger = this.logger;
    const stop = new AbortController();
    async function* frames(): AsyncGenerator<string> {
      try {
        if (!log) throw new Error('the store keeps no frames');
        for await (const event of log.follow(ref, stop.signal)) {
          if (event.kind === 'frame') yield event.data;
          else if (event.kind === 'end' && event.outcome === 'completed') return;
          else if (event.kind === 'end' || event.kind === 'gone') break;
        }
        throw new Error('its frames are gone');
      } catch (err) {
        logger.warn(`idempotency: replaying a streamed answer failed: ${errorText(err)}`);
        yield* brokenEnd(settings);
        if (!settings.errors) throw err;
      } finally {
        stop.abort();
      }
    }
    return framesResponse(stored.status, headers, frames());
  }

  private settingsFor(route: IdempotentOptions): RouteSettings {
    return {
      required: route.required ?? true,
      lockTtlMs: route.lockTtlMs ?? this.options.lockTtlMs ?? DEFAULT_LOCK_TTL_MS,
      resultTtlMs: route.resultTtlMs ?? this.options.resultTtlMs ?? DEFAULT_RESULT_TTL_MS,
      maxStoredBodyBytes: route.maxStoredBodyBytes ?? this.options.maxStoredBodyBytes ?? DEFAULT_MAX_STORED_BODY_BYTES,
      storesStatus: route.storesStatus ?? storesByDefault,
      attachWaitMs: route.attach?.waitMs,
      errors: route.errors,
      replayHeaders: this.replayHeaders,
      store: this.storeNamed(route.store),
      recover: route.recover,
    };
  }

  /** The module's store, or one of its named stores (IdempotentRoutesValidator checks the names at start-up). */
  private storeNamed(name: string | undefined): IdempotencyStore {
    if (name === undefined) return this.store;
    const store = this.options.stores?.[name];
    if (!store) throw new Error(`Idempotency: no store named "${name}" in IdempotencyModule's stores`);
    return store;
  }
}

/** A stored answer as the web Response that sends it. */
function asResponse(stored: StoredResponse): Response {
  return new Response(NULL_BODY_STATUSES.has(stored.status) ? null : stored.body, {
    status: stored.status,
    headers: stored.headers,
  });
}

/**
 * A web Response's Content-Type, set on the response as it is: Nest copies a
 * Response's headers through Express's res.set(), which adds a charset to
 * `application/json` and `text/*` types, and a relayed or replayed answer
 * must keep the exact Content-Type it had.
 */
function withNativeContentType(res: ExpressResponse, value: unknown): unknown {
  if (!isWebResponse(value)) return value;
  const contentType = value.headers.get('content-type');
  if (contentType === null || res.headersSent) return value;
  res.setHeader('Content-Type', contentType);
  value.headers.delete('content-type');
  return value;
}

/** The broken-stream frame of a route that has one; without, the stream is cut (the caller sees it fail). */
function* brokenEnd(settings: RouteSettings): Generator<string> {
  if (settings.errors) yield settings.errors.brokenStreamFrame();
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
  return normalisePath(fill(req.params));
}

/**
 * A handler's web Response as the decision needs it: its body is read only
 * when the route stores its status; one it does not store is sent as it is,
 * unread (a stream or binary body passes through untouched).
 */
async function webResponseOutcome(response: Response, settings: RouteSettings): Promise<HandlerOutcome> {
  const headers = Object.fromEntries(response.headers);
  if (!settings.storesStatus(response.status)) return { kind: 'web-response', status: response.status, headers };
  try {
    return { kind: 'web-response', status: response.status, headers, text: await response.text() };
  } catch (error) {
    return { kind: 'web-response-unreadable', error };
  }
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
