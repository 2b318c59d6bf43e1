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
import { type FrameBatchEvent, frameBatchStep, noFrameBatches } from './frame-batches';
import type { IdempotencyFrameLog } from './idempotency-store.interface';

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
    // The frames' way to the store (frame-batches.ts); the append in flight, awaited before the completion.
    let batches = noFrameBatches();
    let inFlight: Promise<void> | undefined;
    let began: Promise<boolean> | undefined;
    let beginFailed = false;
    let releasing: Promise<void> | undefined;
    let size = 0;

    const stopStoring = (why: string | undefined): Promise<void> => {
      storing = false;
      step({ kind: 'close' });
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
    const append = async (frames: readonly Buffer[]): Promise<void> => {
      try {
        if (!log || !(await began) || !(await log.append(ctx.operation, attempt.token, frames))) {
          // Refused: the lock is not ours any more, unless we stopped storing ourselves meanwhile.
          if (storing && !beginFailed) lease.refused('append refused');
          storing = false;
          step({ kind: 'close' });
        }
      } catch (err) {
        this.metrics.count('store_unavailable');
        this.logger.error(`idempotency: could not store the frames (key ${attempt.keyHash}): ${errorText(err)}`);
        await stopStoring(undefined);
      }
    };
    // The I/O of the batches' steps: a turn's end awaited, an append run (and its end stepped on).
    const step = (event: FrameBatchEvent): void => {
      const next = frameBatchStep(batches, event);
      batches = next.state;
      for (const effect of next.effects) {
        if (effect.kind === 'await-turn') setImmediate(() => step({ kind: 'turn-ended' }));
        else
          inFlight = append(effect.frames).finally(() => {
            inFlight = undefined;
            step({ kind: 'appended' });
          });
      }
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
            } else step({ kind: 'frame', frame });
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
      step({ kind: broken === undefined ? 'close' : 'flush' });
      lease.stop();
      await drained();
      step({ kind: 'close' });
      await releasing;
      if (broken === undefined && storing && log && (await began)) {
        try {
          settled = true;
          const ours = await completeWith(
            log,
            ctx.operation,
            attempt.token,
            ctx.fingerprint,
            settings.resultTtlMs,
            batches.pending,
          );
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

/** The last frames and the completion: in one write where the store can (completeWith), else an append and then it. */
async function completeWith(
  log: IdempotencyFrameLog,
  key: string,
  token: string,
  fingerprint: string,
  resultTtlMs: number,
  frames: readonly Buffer[],
): Promise<boolean> {
  if (log.completeWith) return log.completeWith(key, token, fingerprint, resultTtlMs, frames);
  if (frames.length > 0 && !(await log.append(key, token, frames))) return false;
  return log.complete(key, token, fingerprint, resultTtlMs);
}
