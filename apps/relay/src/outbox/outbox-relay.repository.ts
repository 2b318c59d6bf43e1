import { Injectable } from '@nestjs/common';
import { OutboxSql } from '@app/persistence';
import type { EntityManager } from 'typeorm';
import type { OutboxMessage } from './notification-sender.interface';

/** A row this relay holds until `lease` (the fencing value of every later update). */
export interface ClaimedMessage extends OutboxMessage {
  /** bigint: pg returns it as a string. */
  readonly id: string;
  /** Failed attempts so far. */
  readonly attempts: number;
  /** The `lease_until` this claim stamped, to the millisecond (it round-trips through a JS Date exactly). */
  readonly lease: Date;
  /** The trace of the step that wrote it: the send's span continues it. */
  readonly traceparent?: string;
}

/** A row sent, and the lease it was claimed with. */
export interface SentRow {
  readonly id: string;
  readonly lease: Date;
}

/**
 * The relay's I/O; the SQL text is OutboxSql's (libs/persistence/src/outbox),
 * and every method runs in the EntityManager it is given. Times all come from
 * PostgreSQL's clock (now()), never from the relays' clocks, so leases and
 * backoff mean the same to every relay.
 *
 * Lease ownership: `lease_until` is the fencing token. A claim stamps it with
 * a fresh value, and every update of a claimed row matches that exact value,
 * so a relay whose lease expired and was taken over cannot overwrite the new
 * holder's result: the new claim stamped a strictly later value (it was made
 * after the old lease had passed, and adds the same lease length).
 */
@Injectable()
export class OutboxRelayRepository {
  /**
   * One statement, so one short transaction: lock due rows with SKIP LOCKED
   * (relays never wait for each other), stamp the lease, commit. The row
   * locks end with the statement; during the sends only the lease protects
   * the rows, and nothing blocks another relay. `withTraceparent` (the relay
   * traces) reads each row's trace too: only then is the column named
   * (OutboxSql.claim).
   */
  async claim(
    em: EntityManager,
    batch: number,
    leaseMs: number,
    maxAttempts: number,
    withTraceparent: boolean,
  ): Promise<ClaimedMessage[]> {
    const rows = await returning<ClaimRow>(em, OutboxSql.claim(withTraceparent), [batch, leaseMs, maxAttempts]);
    return rows
      .map((r) => ({
        id: r.id,
        topic: r.topic,
        dedupeKey: r.dedupe_key,
        payload: r.payload,
        attempts: r.attempts,
        lease: r.lease_until,
        ...(r.traceparent ? { traceparent: r.traceparent } : {}),
      }))
      .sort((a, b) => (BigInt(a.id) < BigInt(b.id) ? -1 : 1));
  }

  /**
   * False when the lease is no longer ours: it expired and another relay claimed the row. One row (the
   * relay records crowds with markSentMany).
   */
  async markSent(em: EntityManager, id: string, lease: Date): Promise<boolean> {
    return (await this.markSentMany(em, [{ id, lease }]))[0];
  }

  /** markSent of many rows in one statement; one answer per row, in order. Each id once: the answer is by id. */
  async markSentMany(em: EntityManager, rows: readonly SentRow[]): Promise<boolean[]> {
    const recorded = await returning<{ id: string }>(em, OutboxSql.markSent, [
      rows.map((r) => r.id),
      rows.map((r) => r.lease),
    ]);
    const ids = new Set(recorded.map((r) => String(r.id)));
    return rows.map((r) => ids.has(r.id));
  }

  /** Another try after `delayMs`; the lease is cleared so the row waits only for its backoff. */
  async markFailed(em: EntityManager, id: string, lease: Date, error: string, delayMs: number): Promise<boolean> {
    return (await returning(em, OutboxSql.markFailed, [id, lease, error, delayMs])).length === 1;
  }

  /**
   * The last attempt failed: no more tries until a person re-queues the row (docs/operations.md, Dead letters and
   * parked notifications).
   */
  async park(em: EntityManager, id: string, lease: Date, error: string): Promise<boolean> {
    return (await returning(em, OutboxSql.park, [id, lease, error])).length === 1;
  }

  /**
   * Parks rows that ran out of attempts without being parked (OUTBOX_MAX_ATTEMPTS
   * was lowered): the claim no longer picks them, and they must not hide.
   */
  async parkExhausted(em: EntityManager, maxAttempts: number): Promise<number> {
    const rows = await returning(em, OutboxSql.parkExhausted, [maxAttempts]);
    return rows.length;
  }

  /**
   * Deletes at most `limit` sent rows older than the retention: one batch of
   * deleteInBatches (SKIP LOCKED lets several relays purge side by side).
   */
  async deleteSentBefore(em: EntityManager, retentionDays: number, limit: number): Promise<number> {
    const rows = await returning(em, OutboxSql.deleteSentBefore, [retentionDays, limit]);
    return rows.length;
  }
}

interface ClaimRow {
  id: string;
  topic: string;
  dedupe_key: string;
  payload: Record<string, unknown>;
  attempts: number;
  lease_until: Date;
  /** Absent when the claim did not ask for it, null when the row has none. */
  traceparent?: string | null;
}

/**
 * The rows of a statement with RETURNING. TypeORM's `query` answers an
 * UPDATE or DELETE with `[rows, rowCount]` and anything else with the rows.
 */
async function returning<T = { id: string }>(em: EntityManager, sql: string, params: unknown[]): Promise<T[]> {
  const result: unknown = await em.query(sql, params);
  if (Array.isArray(result) && result.length === 2 && Array.isArray(result[0]) && typeof result[1] === 'number') {
    return result[0] as T[];
  }
  return result as T[];
}
