import { Injectable, Logger } from '@nestjs/common';
import { errorCodeOf, SummaryWriter, type WriteOutcome } from '@app/persistence';
import {
  MalformedSummaryJobError,
  markSummaryJobFailed,
  parseSummaryJob,
  summaryReadyMessage,
  type SummaryJob,
  SummaryStreams,
} from '@app/summary-queue';
import { isUuid } from '@app/ids';
import { classifyLlmError, InjectLlmClient, type LlmClient } from '@app/llm';
import type { ChainableCommander } from 'ioredis';
import {
  type EntrySource,
  JobError,
  type JobHandler,
  type JobRunContext,
  MALFORMED,
  RetryError,
  RetryPolicy,
  type StreamMessage,
  UNEXPECTED,
  WorkerMetrics,
} from '@app/workflows';

/**
 * One delivery of a summary job. Safe to run any number of times for one job:
 * a stored summary short-circuits before the model is called, and the write
 * at the end lets only one delivery store the summary and its notification.
 */
@Injectable()
export class SummaryJobHandler implements JobHandler {
  private readonly logger = new Logger(SummaryJobHandler.name);
  /** The pre-check of a batch, by the entry it was made for: undefined means unknown (the delivery asks itself). */
  private readonly prechecked = new WeakMap<StreamMessage, Promise<boolean | undefined>>();

  constructor(
    private readonly writer: SummaryWriter,
    private readonly retry: RetryPolicy,
    @InjectLlmClient() private readonly llm: LlmClient,
    private readonly metrics: WorkerMetrics,
    private readonly streams: SummaryStreams,
  ) {}

  /** One entry of the job stream: a malformed one throws a JobError (MALFORMED) before anything runs. */
  async process(message: StreamMessage, ctx: JobRunContext): Promise<WriteOutcome> {
    return this.handle(this.parse(message), ctx, this.prechecked.get(message));
  }

  /**
   * The pre-check of a batch read together, in one query instead of one per
   * delivery. It is the same check (the write is still the guard), made when
   * the batch is read, which is when its deliveries start; if the query
   * fails, each delivery asks on its own.
   */
  prepare(messages: readonly StreamMessage[]): void {
    const ids = messages.map((m) => m.fields.job_id).filter((id): id is string => id !== undefined && isUuid(id));
    if (ids.length < 2) return; // one: its own pre-check is the same single query
    const stored = this.writer.storedAmong(ids).catch(() => undefined);
    for (const message of messages) {
      const id = message.fields.job_id;
      if (id !== undefined && isUuid(id))
        this.prechecked.set(
          message,
          stored.then((s) => s?.has(id)),
        );
    }
  }

  /**
   * A dead-lettered entry's job is marked failed for GET, in the consumer's
   * dead-letter MULTI: in the record of the entry's own partition, the one
   * MULTI's slot (where GET looks, as the job id names that partition).
   */
  deadLettered(tx: ChainableCommander, message: StreamMessage, reason: string, source?: EntrySource): void {
    const own = this.streams.at(source?.partition ?? 0);
    if (own) markSummaryJobFailed(tx, message.fields, reason, own);
  }

  /** Every log line of a delivery names its job. */
  logFields(message: StreamMessage): { job_id: string | undefined } {
    return { job_id: message.fields.job_id };
  }

  /** Throws a JobError: RetryError for the model call, `database` for PostgreSQL, `unexpected` for anything else. */
  async handle(
    job: SummaryJob,
    ctx: Pick<JobRunContext, 'deadline' | 'stopRetrying' | 'signal'>,
    prechecked?: Promise<boolean | undefined>,
  ): Promise<WriteOutcome> {
    const stored = (await prechecked) ?? (await this.database(() => this.writer.isStored(job.jobId)));
    if (stored) return 'duplicate';
    const summary = await this.summarize(job, ctx);
    return this.database(() =>
      this.writer.writeWithNotification(
        { jobId: job.jobId, tenant: job.tenant, summary },
        summaryReadyMessage(job.jobId, job.payload.notify),
      ),
    );
  }

  /** The job an entry carries, or a JobError: MALFORMED. */
  private parse(message: StreamMessage): SummaryJob {
    try {
      return parseSummaryJob(message);
    } catch (err) {
      if (err instanceof MalformedSummaryJobError) throw new JobError(err.message, MALFORMED, { cause: err });
      throw err;
    }
  }

  private async summarize(
    job: SummaryJob,
    ctx: Pick<JobRunContext, 'deadline' | 'stopRetrying' | 'signal'>,
  ): Promise<string> {
    try {
      const outcome = await this.retry.run(
        // On the gateway path the tenant is required and the key makes a redelivery reuse the first call.
        (signal) =>
          this.llm.summarize(job.payload.text, { signal, tenant: job.tenant, idempotencyKey: `summary:${job.jobId}` }),
        classifyLlmError,
        {
          deadline: ctx.deadline,
          signal: ctx.signal,
          stopRetrying: ctx.stopRetrying,
          onAttemptFailed: (attempt, error) => {
            this.metrics.llmCalls.inc({ outcome: 'failed', error_class: error.kind });
            this.logger.warn(
              { job_id: job.jobId, attempt, error_class: error.kind, status: error.status },
              'model call failed',
            );
          },
        },
      );
      this.metrics.llmCalls.inc({ outcome: 'ok', error_class: 'none' });
      this.metrics.llmAttempts.observe(outcome.attempts);
      return outcome.value;
    } catch (err) {
      if (!(err instanceof RetryError)) throw new JobError(`unexpected: ${String(err)}`, UNEXPECTED, { cause: err });
      this.metrics.llmAttempts.observe(err.attempts);
      throw err;
    }
  }

  /**
   * PostgreSQL being unreachable or busy, or its schema not migrated yet, is worth a redelivery; anything else is
   * not.
   */
  private async database<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      const failure = { kind: 'database', retryable: isTransientDatabaseError(err) };
      throw new JobError(`database: ${(err as Error).message}`, failure, { cause: err });
    }
  }
}

/**
 * The schema a migration has not created yet: while the migration Job of a
 * rollout still runs, new workers may already take jobs. Worth a redelivery;
 * MAX_DELIVERIES still bounds a migration that never comes.
 * 42P01 undefined_table, 42703 undefined_column, 42883 undefined_function,
 * 42704 undefined_object (a type, an index), 3F000 invalid_schema_name.
 */
const SCHEMA_NOT_READY = new Set(['42P01', '42703', '42883', '42704', '3F000']);

/**
 * SQLSTATE classes 08 (connection), 53 (resources), 57 (operator intervention),
 * 40001/40P01, a schema not migrated yet, and socket errors.
 */
export function isTransientDatabaseError(err: unknown): boolean {
  const code = errorCodeOf(err);
  if (/^(08|53|57)/.test(code) || code === '40001' || code === '40P01') return true;
  if (SCHEMA_NOT_READY.has(code)) return true;
  if (/^E[A-Z]+$/.test(code)) return true; // ECONNREFUSED, ECONNRESET, ...
  const message = err instanceof Error ? err.message : '';
  return /timeout|terminat|Connection|connect/i.test(message);
}
