import { Logger } from '@nestjs/common';
import type { Response as ExpressResponse } from 'express';
import { errorText, type RouteSettings } from './attempt';
import { DirectAnswer } from './direct-answer';
import type { FrameEvent, FramesRef, IdempotencyFrameLog, StoredResponse } from './idempotency-store.interface';
import { pickHeaders } from './settle-decision';
import { bytesOf, framesResponse, isWebResponse } from './streamed-answer';

/** Statuses whose answers have no body, whatever was stored. */
export const NULL_BODY_STATUSES: ReadonlySet<number> = new Set([204, 205, 304]);

/**
 * What a duplicate is sent: a stored answer replayed (whole, or frame by
 * frame from the store's log), or the frames of an answer still running.
 * Every one carries `Idempotent-Replayed: true` and only the allowlisted
 * headers.
 */
export class Replays {
  private readonly logger = new Logger('IdempotencyInterceptor');

  /** @param direct true when the app sends a DirectAnswer (else a whole answer is a web Response) */
  constructor(
    private readonly allowlist: ReadonlySet<string>,
    private readonly direct: () => boolean,
  ) {}

  /** A completed record's answer. */
  stored(
    stored: StoredResponse,
    log: IdempotencyFrameLog | undefined,
    settings: RouteSettings,
  ): Response | DirectAnswer {
    const headers = this.headersOf(stored);
    if (stored.frames) return this.frames(stored, stored.frames, new Headers(headers), log, settings);
    const empty = NULL_BODY_STATUSES.has(stored.status) || stored.body.length === 0;
    if (this.direct()) return new DirectAnswer(stored.status, headers, empty ? null : stored.body);
    if (!empty) headers['content-length'] = String(stored.body.length);
    return new Response(empty ? null : stored.body, { status: stored.status, headers });
  }

  /** The first request's own answer, as it was stored (not a replay: no Idempotent-Replayed). */
  answer(stored: StoredResponse): Response | DirectAnswer {
    const body = NULL_BODY_STATUSES.has(stored.status) ? null : stored.body;
    if (this.direct()) return new DirectAnswer(stored.status, stored.headers, body);
    return new Response(body, { status: stored.status, headers: stored.headers });
  }

  /** The running answer's frames, from the first, as a response that ends as that answer ends. */
  attached(
    head: { status: number; headers: Readonly<Record<string, string>> },
    events: AsyncIterator<FrameEvent>,
    settings: RouteSettings,
    done: () => void,
  ): Response {
    const headers = new Headers(this.headersOf(head));
    const logger = this.logger;
    async function* frames(): AsyncGenerator<Buffer> {
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

  private headersOf(stored: { readonly headers: Readonly<Record<string, string>> }): Record<string, string> {
    // The allowlist again: the record may have been written by another version
    // (or by hand), and Set-Cookie must never come back from a store.
    const headers = pickHeaders(stored.headers, this.allowlist);
    // The body's own type, even under a custom allowlist that leaves it out:
    // it is stored with every answer, and a body without it is another body.
    const contentType = stored.headers['content-type'];
    if (contentType !== undefined) headers['content-type'] = contentType;
    headers['idempotent-replayed'] = 'true';
    return headers;
  }

  /** A stored streamed answer, frame by frame as it is read from the store, never whole in memory. */
  private frames(
    stored: StoredResponse,
    ref: FramesRef,
    headers: Headers,
    log: IdempotencyFrameLog | undefined,
    settings: RouteSettings,
  ): Response {
    const logger = this.logger;
    const stop = new AbortController();
    async function* frames(): AsyncGenerator<Buffer> {
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
}

/**
 * A web Response's Content-Type, set on the response as it is: Nest copies a
 * Response's headers through Express's res.set(), which adds a charset to
 * `application/json` and `text/*` types, and a relayed or replayed answer
 * must keep the exact Content-Type it had.
 */
export function withNativeContentType(res: ExpressResponse, value: unknown): unknown {
  if (!isWebResponse(value)) return value;
  const contentType = value.headers.get('content-type');
  if (contentType === null || res.headersSent) return value;
  res.setHeader('Content-Type', contentType);
  value.headers.delete('content-type');
  return value;
}

/** The broken-stream frame of a route that has one; without, the stream is cut (the caller sees it fail). */
export function* brokenEnd(settings: RouteSettings): Generator<Buffer> {
  if (settings.errors) yield bytesOf(settings.errors.brokenStreamFrame());
}
