import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { OUTBOX_CHANNEL } from './outbox-channel';
import { SummaryRepository } from './repositories/summary.repository';

export const SUMMARY_READY_TOPIC = 'email.summary_ready';
export const summaryReadyDedupeKey = (jobId: string): string => `summary_ready:${jobId}`;

export interface CompletedSummary {
  readonly jobId: string;
  readonly tenant: string;
  readonly summary: string;
  /** Who is told that the summary is ready. */
  readonly notify: string;
}

/** `done`: this call stored the summary and its notification; `duplicate`: another delivery already had. */
export type WriteOutcome = 'done' | 'duplicate';

/**
 * Owns the unit of work that finishes a job: the summary and its outbox row
 * commit together or not at all, and only the delivery that inserted the
 * summary writes the outbox row, so however often a job runs there is one
 * summary and one notification.
 *
 * The unit is one statement, which PostgreSQL runs as one transaction: the
 * summary insert (`ON CONFLICT DO NOTHING RETURNING`), the outbox insert fed
 * by what it returned (no row back, no outbox row), and the relay's wake-up
 * (`pg_notify`, delivered at commit). One round trip instead of four
 * (BEGIN, two inserts, COMMIT), and no pooled connection held across round
 * trips.
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

  async writeWithNotification(done: CompletedSummary): Promise<WriteOutcome> {
    const notified: unknown[] = await this.dataSource.query(
      `WITH summary AS (
         INSERT INTO summaries (job_id, tenant, summary)
         VALUES ($1, $2, $3)
         ON CONFLICT (job_id) DO NOTHING
         RETURNING job_id
       ), message AS (
         INSERT INTO outbox (topic, dedupe_key, payload)
         SELECT $4, $5, $6::jsonb FROM summary
         RETURNING id
       )
       SELECT pg_notify('${OUTBOX_CHANNEL}', id::text) FROM message`,
      [
        done.jobId,
        done.tenant,
        done.summary,
        SUMMARY_READY_TOPIC,
        summaryReadyDedupeKey(done.jobId),
        JSON.stringify({ job_id: done.jobId, to: done.notify }),
      ],
    );
    return notified.length === 1 ? 'done' : 'duplicate';
  }
}
