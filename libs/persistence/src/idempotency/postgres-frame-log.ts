import { type FrameEvent, type FramesRef, type IdempotencyFrameLog, type StoredHead } from '@app/idempotency';
import type { QueryResultRow } from 'pg';
import type { PgNotificationListener, Subscription } from './pg-notification-listener';
import { IdempotencySql, textBody } from './postgres-idempotency.sql';
import { type FrameRow, frameEventOf, parseRef } from './postgres-idempotency.rows';

/** Entries read per statement. */
const PAGE = 256;

/** The store's way to run a statement (a named prepared statement on its pool). */
export type Query = <R extends QueryResultRow = QueryResultRow>(sql: string, params: unknown[]) => Promise<R[]>;

/** The frame logs of PostgresIdempotencyStore's records. */
export class PostgresFrameLog implements IdempotencyFrameLog {
  constructor(
    private readonly query: Query,
    private readonly listener: PgNotificationListener,
    private readonly idleCheckMs: number,
  ) {}

  async begin(key: string, token: string, head: StoredHead): Promise<boolean> {
    const json = JSON.stringify({
      status: head.status,
      headers: head.headers,
      ...(head.storable === false ? { storable: false } : {}),
    });
    return (await this.query(IdempotencySql.begin, [key, token, json])).length === 1;
  }

  async append(key: string, token: string, frames: readonly (Uint8Array | string)[]): Promise<boolean> {
    if (frames.length === 0) return true;
    const [texts, bytes] = columnsOf(frames);
    return (await this.query(IdempotencySql.append, [key, token, texts, bytes])).length === 1;
  }

  complete(key: string, token: string, fingerprint: string, resultTtlMs: number): Promise<boolean> {
    return this.completeWith(key, token, fingerprint, resultTtlMs, []);
  }

  async completeWith(
    key: string,
    token: string,
    fingerprint: string,
    resultTtlMs: number,
    frames: readonly (Uint8Array | string)[],
  ): Promise<boolean> {
    const [texts, bytes] = columnsOf(frames);
    const params = [key, token, fingerprint, resultTtlMs, texts, bytes];
    return (await this.query(IdempotencySql.completeFrames, params)).length === 1;
  }

  /*
   * Subscribed before the first read, so news of anything written after a
   * read wakes the wait that follows it. Registered (WATCH) once caught up,
   * then read again: what was written before the registration is read, and
   * every end after it is written to the log. Without news for idleCheckMs
   * it checks that the attempt still holds its lock; once it does not (or
   * the registration finds it ended), one last read finds the end if one was
   * written, and otherwise the attempt died or its log expired: `gone`.
   */
  async *follow(ref: FramesRef, signal: AbortSignal): AsyncIterable<FrameEvent> {
    const { attempt, key } = parseRef(ref);
    if (signal.aborted) return;
    const news: Subscription = await this.listener.subscribe(attempt);
    try {
      let after = 0;
      let watched = false;
      let ended = false; // the attempt no longer runs: this read is the last
      while (!signal.aborted) {
        news.clear();
        const rows = await this.query<FrameRow>(IdempotencySql.read, [attempt, after, PAGE]);
        for (const row of rows) {
          after = row.seq;
          if (signal.aborted) return;
          const event = frameEventOf(row);
          yield event;
          if (event.kind === 'end') return;
        }
        if (rows.length === PAGE) continue;
        if (ended) {
          if (!signal.aborted) yield { kind: 'gone' };
          return;
        }
        if (!watched) {
          watched = true;
          ended = (await this.query(IdempotencySql.watch, [key, attempt])).length === 0;
          continue;
        }
        if (await news.wait(this.idleCheckMs, signal)) continue;
        if (signal.aborted) return;
        ended = (await this.query(IdempotencySql.alive, [key, attempt])).length === 0;
      }
    } finally {
      news.unsubscribe();
    }
  }
}

/** Frames as the statements take them: each as text (UTF-8 without NUL) or as bytes, null in the other column. */
function columnsOf(frames: readonly (Uint8Array | string)[]): [(string | null)[], (Buffer | null)[]] {
  const stored = frames.map((frame) => textBody(frame));
  return [stored.map((f) => f.text), stored.map((f) => f.bytes)];
}
