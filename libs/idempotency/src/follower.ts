import { HttpException, Logger } from '@nestjs/common';
import type { Request, Response as ExpressResponse } from 'express';
import { type Attempt, errorText, type InProgress } from './attempt';
import { IdempotencyStoreUnavailableException } from './idempotency.errors';
import type { ClaimResult, FrameEvent, IdempotencyFrameLog } from './idempotency-store.interface';
import type { Replays } from './replays';
import type { RequestOutcomes } from './request-outcomes';
import { onceClosed } from './streamed-answer';

/** Duplicates following running requests in this process, at most; more get the 409. */
export const MAX_FOLLOWERS = 1000;
/** A re-claim after a followed request ended finds it settled; a few rounds cover a takeover race. */
const MAX_FOLLOW_ROUNDS = 4;

/** How following ended: with an answer for the caller, or with the key claimed, for this request to run. */
export type Followed =
  { readonly kind: 'answer'; readonly value: unknown } | { readonly kind: 'run'; readonly tookOver: boolean };

/**
 * A duplicate of a running request: follows it, on whichever instance it
 * runs, until its answer starts (attached: its frames so far, then the live
 * ones) or it ends (claimed again: its stored answer, or the key is free and
 * this request runs it). Waits at most the route's `attach.waitMs` for
 * either, then answers 409 as an unattached duplicate would.
 */
export class Follower {
  private readonly logger = new Logger('IdempotencyInterceptor');
  private followers = 0;

  constructor(
    private readonly replays: Replays,
    private readonly outcomes: RequestOutcomes,
  ) {}

  /** Room for one more: fewer than MAX_FOLLOWERS follow now. */
  get hasRoom(): boolean {
    return this.followers < MAX_FOLLOWERS;
  }

  async follow(
    log: IdempotencyFrameLog,
    first: InProgress,
    req: Request,
    res: ExpressResponse,
    attempt: Attempt,
  ): Promise<Followed> {
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
    const answer = (value: unknown): Followed => ({ kind: 'answer', value });
    try {
      let claim: ClaimResult = first;
      for (let round = 0; round < MAX_FOLLOW_ROUNDS; round++) {
        if (claim.outcome === 'completed') {
          if (!attempt.sameBody(claim.fingerprint)) return this.outcomes.mismatch(req);
          this.outcomes.set(req, 'attached');
          return answer(this.replays.stored(claim.response, log, settings));
        }
        // The key was freed while this one followed: it runs, as a first request would.
        if (claim.outcome === 'claimed') return { kind: 'run', tookOver: claim.tookOver === true };
        if (!attempt.sameBody(claim.fingerprint)) return this.outcomes.mismatch(req);
        if (!claim.frames) return this.outcomes.inProgress(req, claim, attempt);
        // A timer of its own, not AbortSignal.timeout(): the wait ends when the answer starts, the following does not.
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
          if (gone.signal.aborted) return answer(undefined); // nobody to answer
          return this.outcomes.inProgress(req, claim, attempt);
        }
        if (firstEvent.value.kind === 'head' && firstEvent.value.head.storable === false) {
          // Relayed to its caller only: nothing to attach to, and the key is not free until it ends.
          await events.return?.();
          return this.outcomes.inProgress(req, claim, attempt);
        }
        if (firstEvent.value.kind === 'head') {
          this.outcomes.set(req, 'attached');
          handedOver = true;
          // Only the caller going away stops it from here; the waiting timer is cleared.
          return answer(this.replays.attached(firstEvent.value.head, events, settings, leave));
        }
        // It ended without streaming (a whole answer, or freed), or died: look again.
        await events.return?.();
        claim = await settings.store.claim(ctx.operation, attempt.token, ctx.fingerprint, settings.lockTtlMs);
      }
      return this.outcomes.inProgress(req, first, attempt);
    } catch (err) {
      if (err instanceof HttpException) throw err;
      this.outcomes.set(req, 'store_unavailable');
      this.logger.warn(`idempotency: following a running request failed (key ${attempt.keyHash}): ${errorText(err)}`);
      throw new IdempotencyStoreUnavailableException();
    } finally {
      if (!handedOver) leave();
    }
  }
}
