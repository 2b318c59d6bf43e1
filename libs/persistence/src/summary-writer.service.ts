import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { OutboxRepository } from './repositories/outbox.repository';
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
 */
@Injectable()
export class SummaryWriter {
  constructor(
    private readonly dataSource: DataSource,
    private readonly summaries: SummaryRepository,
    private readonly outbox: OutboxRepository,
  ) {}

  async isStored(jobId: string): Promise<boolean> {
    return this.summaries.exists(this.dataSource.manager, jobId);
  }

  async writeWithNotification(done: CompletedSummary): Promise<WriteOutcome> {
    return this.dataSource.transaction(async (em) => {
      const won = await this.summaries.insertIfAbsent(em, done);
      if (!won) return 'duplicate';
      await this.outbox.insert(em, {
        topic: SUMMARY_READY_TOPIC,
        dedupeKey: summaryReadyDedupeKey(done.jobId),
        payload: { job_id: done.jobId, to: done.notify },
      });
      return 'done';
    });
  }
}
