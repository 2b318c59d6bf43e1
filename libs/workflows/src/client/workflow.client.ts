import { Injectable, Optional } from '@nestjs/common';
import type { IdempotencyRequestContext } from '@app/idempotency';
import { type Durability, InjectRedis, InjectRedisDurability, type RedisClient } from '@app/redis';
import { isUuid } from '@app/ids';
import { jobIdFor } from '../run-ids';
import { ClientQueues } from './client-queues';
import { writeRunStart } from './run-start';
import { type RecordFact, type RunRecord, type RunSnapshot, runAnswer } from './run-status';
import { RunStateUnavailableError, RunTenantMismatchError, UnregisteredWorkflowError } from './workflow-client.errors';
import { WorkflowRunsReader } from './workflow-runs.reader';

/**
 * The one workflow whose history predates the engine: a summaries job done
 * before it ran on workflows left only its `summaries` row.
 */
const SUMMARIES = 'summaries';

export interface StartOptions {
  /** The tenant starting the run, who alone may read it. */
  readonly tenant: string;
  /**
   * The starting request's idempotency context (`@IdempotencyContext()` of an
   * `@Idempotent()` route): the run id derives from its operation
   * (`<tenant>:<METHOD>:<path>:<key>`), so the same request always names the
   * same run and a bare key of one tenant can never name another's. The
   * operation must be scoped to `tenant`.
   */
  readonly idempotency: Pick<IdempotencyRequestContext, 'operation'>;
}

export interface StartedRun {
  readonly runId: string;
  /** The first step's entry id in its partition's stream. */
  readonly entryId: string;
}

/**
 * The api's side of the workflows: starts runs (a record and the first
 * step's entry on the workflow's queue) and tells where a run stands (GET
 * /v1/runs), from the worker's rows in PostgreSQL and the run records in Redis.
 */
@Injectable()
export class WorkflowClient {
  constructor(
    private readonly queues: ClientQueues,
    @InjectRedis() private readonly redis: RedisClient,
    private readonly reader: WorkflowRunsReader,
    @Optional() @InjectRedisDurability() private readonly durability?: Durability,
  ) {}

  /** The id `start` gives the run of a request (its idempotency operation, as in StartOptions). */
  runIdFor(idempotency: Pick<IdempotencyRequestContext, 'operation'>): string {
    return jobIdFor(idempotency.operation);
  }

  /**
   * Records the run and queues its first step. On a cluster it resolves only
   * once a replica holds both (WAIT, RedisModule's durability), as a summaries
   * job does. RunNotQueuedError when Redis did not take it or no replica
   * confirmed it in time (the run may still be on the master; a retry with
   * the same key starts the same run, once): the one error worth a retry.
   * Bugs, thrown before anything is written: UnregisteredWorkflowError for a
   * workflow not registered with forClient, RunTenantMismatchError for an
   * operation not scoped to `tenant` or a run whose record is another
   * tenant's (left as it was).
   */
  async start(name: string, input: unknown, { tenant, idempotency }: StartOptions): Promise<StartedRun> {
    const workflow = this.queues.workflows.get(name);
    if (!workflow) throw new UnregisteredWorkflowError(name);
    if (!idempotency.operation.startsWith(`${tenant}:`)) throw new RunTenantMismatchError(tenant, 'operation');
    const runId = this.runIdFor(idempotency);
    const entryId = await writeRunStart(
      this.redis,
      workflow.layout.of(runId),
      { runId, tenant, input, ...(workflow.shared ? { workflow: name } : {}) },
      this.durability,
    );
    return { runId, entryId };
  }

  /**
   * The run as GET /v1/runs/<run_id> shows it, when it is `tenant`'s;
   * undefined for any other id (not a UUID, unknown, another tenant's).
   * PostgreSQL and every queue's record are read at once; a run with a row
   * reads while Redis is down. RunStateUnavailableError when what did not
   * answer might have held the run.
   */
  async find(runId: string, tenant: string): Promise<RunSnapshot | undefined> {
    if (!isUuid(runId)) return undefined;
    const id = runId.toLowerCase();
    const [stored, ...records] = await Promise.allSettled([
      this.reader.find(id, this.queues.workflows.has(SUMMARIES)),
      ...this.queues.queues.map((q) => this.record(q.layout.of(id).jobRecordKey(id))),
    ]);
    if (stored.status === 'rejected') throw new RunStateUnavailableError(stored.reason);
    const { row, stepRows, summary } = stored.value;
    const answer = runAnswer({
      runId: id,
      tenant,
      ...(row ? { row } : {}),
      stepRows,
      ...(summary ? { summary: { ...summary, workflow: SUMMARIES } } : {}),
      records: records.map((r, i): RecordFact =>
        r.status === 'rejected'
          ? { unavailable: true }
          : { record: r.value, soleWorkflow: this.queues.queues[i].soleWorkflow },
      ),
    });
    if (answer.kind === 'unavailable') throw new RunStateUnavailableError();
    return answer.kind === 'found' ? answer.run : undefined;
  }

  private async record(key: string): Promise<RunRecord | undefined> {
    const h = await this.redis.hgetall(key);
    if (!h.tenant) return undefined;
    const until = Number(h.tokens_wait_until);
    const waiting =
      h.tokens_wait_step && Number.isFinite(until) && until > Date.now()
        ? { reason: 'token_limit' as const, step: h.tokens_wait_step, until: new Date(until).toISOString() }
        : undefined;
    return {
      tenant: h.tenant,
      ...(h.workflow ? { workflow: h.workflow } : {}),
      ...(h.status === 'failed' ? { status: 'failed' as const, error: h.error ?? 'failed' } : {}),
      ...(waiting ? { waiting } : {}),
    };
  }
}
