import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { OutboxSql, type NewOutboxMessage } from './outbox/outbox.sql';
import { SummaryRepository } from './repositories/summary.repository';

export interface CompletedSummary {
  readonly jobId: string;
  readonly tenant: string;
  readonly summary: string;
}

/** `done`: this call stored the summary and its notification; `duplicate`: another delivery already had. */
export type WriteOutcome = 'done' | 'duplicate';

/**
 * Owns the unit of work that finishes a job: the summary and its outbox row
 * commit together or not at all, and only the delivery that inserted the
 * summary writes the outbox row, so however often a job runs there is one
 * summary and one notification. What the notification says (topic, dedupe
 * key, payload) is the caller's: this writer only stores it.
 *
 * The unit is one statement, which PostgreSQL runs as one transaction: the
 * summary insert (`ON CONFLICT DO NOTHING RETURNING`), the outbox insert fed
 * by what it returned (no row back, no outbox row), and the relay's wake-up
 * (`pg_notify`, delivered at commit); see OutboxSql.insertAfter. One round
 * trip instead of four (BEGIN, two inserts, COMMIT), and no pooled connection
 * held across round trips.
 */
@Injectable()
export class SummaryWriter {
  constructor(
    private readonly dataSource: DataSource,
    private readonly summaries: SummaryRepository,
  ) {}

  async isStored(jobId: string): Promise<boolean> {
    return this.summaries.exists(this.dataSource.manager, jobId);
  }

  /** Which of `jobIds` are stored already, in one round trip (the pre-check of a batch just read). */
  async storedAmong(jobIds: readonly string[]): Promise<Set<string>> {
    return this.summaries.storedAmong(this.dataSource.manager, jobIds);
  }

  async writeWithNotification(done: CompletedSummary, message: NewOutboxMessage): Promise<WriteOutcome> {
    const notified: unknown[] = await this.dataSource.query(
      OutboxSql.insertAfter(
        `INSERT INTO summaries (job_id, tenant, summary)
         VALUES ($1, $2, $3)
         ON CONFLICT (job_id) DO NOTHING
         RETURNING job_id`,
        4,
      ),
      [done.jobId, done.tenant, done.summary, message.topic, message.dedupeKey, JSON.stringify(message.payload)],
    );
    return notified.length === 1 ? 'done' : 'duplicate';
  }
}
