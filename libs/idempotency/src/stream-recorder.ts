import { Logger } from '@nestjs/common';
import type { Response as ExpressResponse } from 'express';
import { type Attempt, errorText } from './attempt';
import type { AttemptSettler } from './attempt-settler';
import { IdempotencyMetrics } from './idempotency.metrics';
import type { LockLease } from './lock-lease';
import { brokenEnd } from './replays';
import type { HandlerDurations } from './retry-after';
import { pickHeaders } from './settle-decision';
import { FrameChannel, framesAsBytes, framesResponse, onceClosed, type StreamedAnswer } from './streamed-answer';

/**
 * A streamed answer: each frame goes to the caller at once and to the store
 * soon after (appends batched by event-loop turn, one in flight at a time,
 * so the store never holds the answer back), and the record is complete, or
 * freed, before the caller's stream ends. The frames that came after the
 * last append are written with the completion, in the same round trip: the
 * end of a keyed stream waits for that one write (and for an append still
 * in flight), not for an append and then the completion. The frames are
 * read here, not by the caller: one who goes away stops nothing, and the
 * answer is stored for its retry.
 */
export class StreamRecorder {
  private readonly logger = new Logger('IdempotencyInterceptor');

  constructor(
    private readonly metrics: IdempotencyMetrics,
    private readonly settler: AttemptSettler,
    private readonly durations: HandlerDurations,
  ) {}

  record(answer: StreamedAnswer, res: ExpressResponse, attempt: Attempt, lease: LockLease, started: number): Response {
    const { context: ctx, settings } = attempt;
    const headers = pickHeaders(answer.headers, settings.replayHeaders);
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
    const { storable } = answer;
    let storing = storable && settings.storesStatus(answer.status) && log !== undefined;
    let settled = false;
    let pending: Buffer[] = [];
    let inFlight: Promise<void> | undefined;
    let flushQueued = false;
    // The frames have ended: no batch starts any more, what is pending goes with the completion (or nowhere).
    let closing = false;
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
        releasing = this.settler.release(attempt, lease);
      }
      return releasing ?? Promise.resolve();
    };
    const flush = (): void => {
      if (closing || !storing || inFlight || pending.length === 0 || !log) return;
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
    // After this turn's frames: the frames of one chunk go in one append, and a stream's last frame, whose end comes
    // in the same turn, is left to the completion.
    const flushSoon = (): void => {
      if (flushQueued) return;
      flushQueued = true;
      setImmediate(() => {
        flushQueued = false;
        flush();
      });
    };
    const drained = async (): Promise<void> => {
      while (inFlight) await inFlight;
    };

    if (!storable) {
      // Nothing to log, but the key stays ours (the lease renews it) until the
      // answer ends: a duplicate meanwhile gets 409, not a second upstream
      // call. The head alone tells followers on any instance not to wait for
      // frames that will never come.
      this.metrics.count('not_stored');
      void log
        ?.begin(ctx.operation, attempt.token, { status: answer.status, headers, storable: false })
        .catch((err: unknown) => {
          this.metrics.count('store_unavailable');
          this.logger.error(
            `idempotency: could not mark an answer as not stored (key ${attempt.keyHash}): ${errorText(err)}`,
          );
        });
    } else if (!log && settings.storesStatus(answer.status)) {
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
        for await (const frame of framesAsBytes(answer.frames)) {
          if (storing) {
            size += frame.length;
            if (size > settings.maxStoredBodyBytes) {
              void stopStoring(`a streamed answer exceeds ${settings.maxStoredBodyBytes} bytes`);
            } else {
              pending.push(frame);
              flushSoon();
            }
          }
          await channel.push(frame);
          // Nothing is stored for a retry: a caller that went away leaves nobody to read it for.
          if (!storable && channel.isDetached) break;
        }
      } catch (err) {
        broken = err ?? new Error('the stream broke');
      }
      // Whole: what is pending goes with the completion. Broken: what came before the break still reaches followers,
      // ahead of the end that frees the key.
      if (broken === undefined) closing = true;
      else flush();
      lease.stop();
      await drained();
      closing = true;
      await releasing;
      if (broken === undefined && storing && log && (await began)) {
        try {
          settled = true;
          const last = pending;
          pending = [];
          const ours = await log.complete(ctx.operation, attempt.token, ctx.fingerprint, settings.resultTtlMs, last);
          if (!ours) lease.refused('finalise refused');
        } catch (err) {
          this.metrics.count('store_unavailable');
          this.logger.error(`idempotency: could not store the answer (key ${attempt.keyHash}): ${errorText(err)}`);
        }
      } else if (!settled) {
        settled = true;
        await this.settler.release(attempt, lease);
      }
      this.durations.record(attempt.handler, performance.now() - started);
      if (broken !== undefined) {
        this.logger.warn(
          `idempotency: a streamed answer broke before its end (key ${attempt.keyHash}): ${errorText(broken)}`,
        );
        if (answer.framed) for (const frame of brokenEnd(settings)) await channel.push(frame);
        if (!settings.errors || !answer.framed) {
          channel.fail(broken);
          return;
        }
      }
      channel.end();
    };
    void pump();
    return framesResponse(answer.status, new Headers(answer.headers), channel, () => channel.detach());
  }
}
