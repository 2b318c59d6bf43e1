import { Injectable, Optional } from '@nestjs/common';
import { type Durability, InjectRedis, InjectRedisDurability, RedisScript, type RedisClient } from '@app/redis';
import { isUuid } from '@app/ids';
// @app/summary-queue imports this lib (QueueLayout): only values read at call time come from it (the job ids'
// namespace, the record TTL), so the cycle is harmless whichever index loads first. Keep it that way.
import { jobIdFor, JOB_RECORD_TTL_MS } from '@app/summary-queue';
import { DataSource } from 'typeorm';
import { ClientQueues } from './client-queues';
import { type RecordFact, type RunRecord, type RunSnapshot, runAnswer } from './run-status';
import { RunStateUnavailableError, UnregisteredWorkflowError } from './workflow-client.errors';
import { WorkflowRunsReader } from './workflow-runs.reader';

/*
 * A run's start, the summaries enqueue generalised: the run record and the
 * first step's entry in one script (one round trip, never one without the
 * other: both under the run's partition's tag). accepted_at keeps the first
 * time; a second start of the same run (a retry after a crash before the
 * idempotency record was finalised) adds a second entry with the same run id,
 * which the worker's step rows make run once. On the shared queue the record
 * and the entry name the workflow (ARGV[6]); on a queue of its own they do not,
 * so a summaries entry is exactly what the summaries route always wrote.
 * KEYS: the run record, the stream. ARGV: run id, tenant, payload, accepted_at
 * (ms), record TTL (ms), workflow or ''.
 */
const START = new RedisScript(
  'workflow-start',
  `if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'tenant', ARGV[2], 'workflow', ARGV[6])
else
  redis.call('HSET', KEYS[1], 'tenant', ARGV[2])
end
redis.call('HSETNX', KEYS[1], 'accepted_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if ARGV[6] ~= '' then
  return redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[1], 'tenant', ARGV[2], 'payload', ARGV[3], 'workflow', ARGV[6])
end
return redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[1], 'tenant', ARGV[2], 'payload', ARGV[3])`,
);

/**
 * The one workflow whose history predates the engine: a summaries job done
 * before it ran on workflows left only its `summaries` row.
 */
const SUMMARIES = 'summaries';

export interface StartOptions {
  readonly tenant: string;
  /**
   * The idempotency operation that starts the run: `IdempotencyRequestContext.operation`
   * (`<tenant>:<METHOD>:<path>:<key>`), not the bare Idempotency-Key. The run id
   * is derived from it, so the same request always names the same run.
   */
  readonly key: string;
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
  private readonly reader = new WorkflowRunsReader();

  constructor(
    private readonly queues: ClientQueues,
    @InjectRedis() private readonly redis: RedisClient,
    private readonly dataSource: DataSource,
    @Optional() @InjectRedisDurability() private readonly durability?: Durability,
  ) {}

  /** The id `start` gives the run of operation `key` (the idempotency operation, as in StartOptions). */
  runIdFor(key: string): string {
    return jobIdFor(key);
  }

  /**
   * Records the run and queues its first step. On a cluster it resolves only
   * once a replica holds both (WAIT, RedisModule's durability), as a summaries
   * job does: NotReplicatedError when none confirms in time (the run may still
   * be on the master; a retry with the same key starts the same run, once).
   * UnregisteredWorkflowError for a workflow not registered with forClient.
   */
  async start(name: string, input: unknown, { tenant, key }: StartOptions): Promise<StartedRun> {
    const workflow = this.queues.workflows.get(name);
    if (!workflow) throw new UnregisteredWorkflowError(name);
    const runId = this.runIdFor(key);
    const partition = workflow.layout.of(runId);
    const entryId = await START.runDurably<string>(
      this.redis,
      [partition.jobRecordKey(runId), partition.jobs],
      [runId, tenant, JSON.stringify(input), Date.now(), JOB_RECORD_TTL_MS, workflow.shared ? name : ''],
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
      this.reader.find(this.dataSource.manager, id, this.queues.workflows.has(SUMMARIES)),
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
    return {
      tenant: h.tenant,
      ...(h.workflow ? { workflow: h.workflow } : {}),
      ...(h.status === 'failed' ? { status: 'failed' as const, error: h.error ?? 'failed' } : {}),
    };
  }
}
