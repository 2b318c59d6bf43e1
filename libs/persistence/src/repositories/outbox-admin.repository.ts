import { Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { OutboxSql } from '../outbox/outbox.sql';

export interface ParkedMessage {
  readonly id: string;
  readonly topic: string;
  readonly dedupeKey: string;
  readonly attempts: number;
  readonly lastError: string | null;
  readonly createdAt: Date;
  readonly parkedAt: Date;
}

export interface OutboxFigures {
  /** Unsent rows still being tried. */
  readonly backlog: number;
  /** Age of the oldest of them, in seconds (0 when there is none). */
  readonly oldestUnsentAgeSeconds: number;
  /** Rows that ran out of attempts and wait for a person. */
  readonly parked: number;
}

/**
 * I/O for the people who mend the outbox (admin API and CLI): parked rows and
 * the figures. A re-queue gives a parked row a fresh set of attempts, due
 * now, and wakes the relays in the same statement.
 */
@Injectable()
export class OutboxAdminRepository {
  async listParked(em: EntityManager, limit = 50): Promise<ParkedMessage[]> {
    const rows: {
      id: string;
      topic: string;
      dedupe_key: string;
      attempts: number;
      last_error: string | null;
      created_at: Date;
      parked_at: Date;
    }[] = await em.query(OutboxSql.listParked, [limit]);
    return rows.map((r) => ({
      id: String(r.id),
      topic: r.topic,
      dedupeKey: r.dedupe_key,
      attempts: r.attempts,
      lastError: r.last_error,
      createdAt: r.created_at,
      parkedAt: r.parked_at,
    }));
  }

  /** Re-queues one parked row (by id) or all of them (id undefined); returns the ids re-queued. */
  async requeueParked(em: EntityManager, id?: string): Promise<string[]> {
    const rows: { id: string }[] = await em.query(OutboxSql.requeueParked, [id ?? null]);
    return rows.map((r) => String(r.id));
  }

  /** Read on every metrics scrape; only unsent rows are read (see OutboxSql.figures). */
  async figures(em: EntityManager): Promise<OutboxFigures> {
    const [row]: { backlog: string; parked: string; oldest: number | null }[] = await em.query(OutboxSql.figures);
    return {
      backlog: Number(row.backlog),
      parked: Number(row.parked),
      oldestUnsentAgeSeconds: Math.max(0, row.oldest ?? 0),
    };
  }
}
