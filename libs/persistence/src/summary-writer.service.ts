import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { MicroBatcher } from '@app/batching';
import { errorCodeOf } from './error-code';
import { OutboxSql, type NewOutboxMessage } from './outbox/outbox.sql';
import { SummaryRepository } from './repositories/summary.repository';

export interface CompletedSummary {
  readonly jobId: string;
  readonly tenant: string;
  readonly summary: string;
}

/** `done`: this call stored the summary and its notification; `duplicate`: another delivery already had. */
export type WriteOutcome = 'done' | 'duplicate';

interface SummaryWrite {
  readonly done: CompletedSummary;
  readonly message: NewOutboxMessage;
}

/** A worker's jobs finish 16 (its concurrency) at a time at most; a few workers' worth fits one statement. */
const MAX_BATCH = 64;
/** One statement commits while the next batch gathers; two at once keep a slow commit from holding up the rest. */
const MAX_IN_FLIGHT = 2;

/**
 * $1..$6: arrays of job ids, tenants, summaries, topics, dedupe keys and JSON payloads, one element per job.
 * Returns the dedupe key of each outbox row written: the jobs this statement finished. The batcher keeps two
 * writes of one job apart (by its lowercased id); DISTINCT ON makes sure of it here too, since the outbox insert
 * joins the input on the uuid: one input row per job id, or a job could get two outbox rows.
 */
const WRITE_SUMMARIES = OutboxSql.insertAfterEach(
  `SELECT DISTINCT ON (job_id) *
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[])
       AS j(job_id, tenant, summary, topic, dedupe_key, payload)`,
  `INSERT INTO summaries (job_id, tenant, summary)
   SELECT job_id, tenant, summary FROM input
   ON CONFLICT (job_id) DO NOTHING
   RETURNING job_id`,
  'job_id',
);

/** Errors of one row's data (SQLSTATE classes 22 and 23: a bad value, a constraint): worth writing the rest alone. */
function isRowError(err: unknown): boolean {
  return /^2[23]/.test(errorCodeOf(err));
}

/**
 * Owns the unit of work that finishes a job: the summary and its outbox row
 * commit together or not at all, and only the delivery that inserted the
 * summary writes the outbox row, so however often a job runs there is one
 * summary and one notification. What the notification says (topic, dedupe
 * key, payload) is the caller's: this writer only stores it.
 *
 * The unit is one statement, which PostgreSQL runs as one transaction: the
 * summaries insert (`ON CONFLICT DO NOTHING RETURNING`), the outbox insert fed
 * by what it returned (no row back, no outbox row), and the relay's wake-up
 * (`pg_notify`, delivered at commit); see OutboxSql.insertAfterEach. One
 * round trip instead of four (BEGIN, two inserts, COMMIT), and no pooled
 * connection held across round trips.
 *
 * Group commit: the jobs of a worker that finish together (while a write is
 * running, or in the same turn of the event loop) are written by one such
 * statement, their rows passed as arrays (`unnest`), so a crowd of jobs costs
 * one round trip, one plan and one WAL flush instead of one each. Each job
 * still gets its own outcome. A batch that fails is written again job by job,
 * so a job whose rows cannot be written (a dedupe key already taken) fails
 * alone; a batch that fails for any other reason (the connection, a timeout)
 * fails each of its jobs with that error, as one write of its own would have.
 * Two writes of one job (its id in any letter case) never share a statement;
 * they may run at once in two, where PostgreSQL's unique index makes one of
 * them `duplicate`.
 */
@Injectable()
export class SummaryWriter {
  private readonly writes = new MicroBatcher<SummaryWrite, WriteOutcome>({
    run: (batch) => this.writeBatch(batch),
    maxBatch: MAX_BATCH,
    maxInFlight: MAX_IN_FLIGHT,
    keys: (w) => [w.done.jobId.toLowerCase(), w.message.dedupeKey],
    isolateFailures: isRowError,
  });

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

  writeWithNotification(done: CompletedSummary, message: NewOutboxMessage): Promise<WriteOutcome> {
    return this.writes.submit({ done, message });
  }

  private async writeBatch(batch: readonly SummaryWrite[]): Promise<WriteOutcome[]> {
    const written: { dedupe_key: string }[] = await this.dataSource.query(WRITE_SUMMARIES, [
      batch.map((w) => w.done.jobId),
      batch.map((w) => w.done.tenant),
      batch.map((w) => w.done.summary),
      batch.map((w) => w.message.topic),
      batch.map((w) => w.message.dedupeKey),
      batch.map((w) => JSON.stringify(w.message.payload)),
    ]);
    const done = new Set(written.map((r) => r.dedupe_key));
    return batch.map((w) => (done.has(w.message.dedupeKey) ? 'done' : 'duplicate'));
  }
}
