import { Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';

export interface StoredSummary {
  readonly jobId: string;
  readonly tenant: string;
  readonly summary: string;
  readonly createdAt: Date;
}

/** I/O only: every method runs in the EntityManager it is given. */
@Injectable()
export class SummaryRepository {
  async exists(em: EntityManager, jobId: string): Promise<boolean> {
    const rows: unknown[] = await em.query('SELECT 1 FROM summaries WHERE job_id = $1', [jobId]);
    return rows.length > 0;
  }

  /** Which of `jobIds` (UUIDs) have a summary: one query for a batch of them. */
  async storedAmong(em: EntityManager, jobIds: readonly string[]): Promise<Set<string>> {
    const rows: { job_id: string }[] = await em.query('SELECT job_id FROM summaries WHERE job_id = ANY($1::uuid[])', [
      jobIds,
    ]);
    return new Set(rows.map((r) => r.job_id));
  }

  async findForTenant(em: EntityManager, jobId: string, tenant: string): Promise<StoredSummary | undefined> {
    const rows: { job_id: string; tenant: string; summary: string; created_at: Date }[] = await em.query(
      'SELECT job_id, tenant, summary, created_at FROM summaries WHERE job_id = $1 AND tenant = $2',
      [jobId, tenant],
    );
    const r = rows[0];
    return r && { jobId: r.job_id, tenant: r.tenant, summary: r.summary, createdAt: r.created_at };
  }
}
