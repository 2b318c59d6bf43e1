import { Injectable } from '@nestjs/common';
import { MicroBatcher } from '@app/batching';
import { errorCodeOf, type NewOutboxMessage, OUTBOX_CHANNEL } from '@app/persistence';
import { DataSource, type EntityManager, type QueryRunner } from 'typeorm';
import type { StepInsert } from './step-context';
import { SQL_NAME } from './step-context';
import { isConnectionError } from './database-errors';
import { NonRetryableStepError } from './workflow.errors';

/** What a delivery tells `begin`. */
export interface BeginStep {
  readonly runId: string;
  readonly workflow: string;
  readonly tenant: string;
  /** The workflow's steps in order: the run row's `steps`. */
  readonly steps: readonly string[];
  readonly step: string;
  /** The entry was put back by a re-drive: it alone may set a failed run running again. */
  readonly redriven?: boolean;
  /**
   * This delivery's number (1 first): a step row this begin creates counts it as its attempts, since a run's first
   * step is run once before any row is written (`runsUnbegun`).
   */
  readonly delivery: number;
}

/** The step's row after `begin`, and its run's. */
export interface BegunStep {
  /**
   * `done`: committed by an earlier delivery (its `output` is the recorded one); `busy`: its run's row is locked by
   * another delivery (a step in its own transaction, a commit), which decides: nothing was changed, retry later;
   * `failed`: its run failed (another delivery decided and dead-lettered it) and this entry is no re-drive: nothing
   * was changed; else now `running`.
   */
  readonly status: 'running' | 'done' | 'busy' | 'failed';
  readonly output: unknown;
  readonly attempts: number;
  /** Since the run's deadline base (its row's creation, or its last re-drive), by PostgreSQL's clock. */
  readonly runAgeMs: number;
  /** This begin created the run's row: the run's first step begun for the first time (a run started). */
  readonly runCreated: boolean;
}

/** What one step commits. */
export interface StepCommit {
  readonly runId: string;
  readonly step: string;
  /** The step's output (null when it returned nothing). */
  readonly output: unknown;
  /** The run's output when this is its last step (the steps' outputs merged): the run is then done. */
  readonly runOutput?: unknown;
  readonly inserts: readonly StepInsert[];
  readonly outbox: readonly NewOutboxMessage[];
  /**
   * The step ran before any begin (a run's first step on its first delivery, `runsUnbegun`): the commit writes the
   * run's row and the step's (attempts 1) when the run has no row yet; when it has one (another delivery began it
   * meanwhile), the step row guards as for any step.
   */
  readonly unbegun?: { readonly workflow: string; readonly tenant: string; readonly steps: readonly string[] };
}

/** `won`: this delivery committed the step; `lost`: another delivery had, or holds the step now. */
export type CommitOutcome = 'won' | 'lost';

/** A commit's outcome, whether it made the run's row (an unbegun first step: the run started), the attempts. */
export interface CommitResult {
  readonly outcome: CommitOutcome;
  readonly runCreated: boolean;
  /** The step row's attempts when this commit won (deliveries that began it, this one counted). */
  readonly attempts: number;
}

/** A step transaction opened for `StepContext.transaction()`. */
export interface StepTransaction {
  readonly manager: EntityManager;
  /** Runs the commit statement for this step in the transaction and commits it; `lost`: rolled back instead. */
  commit(step: StepCommit): Promise<CommitResult>;
  /** Rolls back (idempotent) and releases the connection. */
  rollback(): Promise<void>;
}

/** What fails a run for good. */
export interface FailedStep extends Omit<BeginStep, 'delivery'> {
  readonly error: string;
  /**
   * The step ran unbegun (`runsUnbegun`) and has no row: one is written `failed` with these attempts. Without it, a
   * step with no row gets none (an unknown step's name is not one of the run's steps).
   */
  readonly unbegunAttempts?: number;
}

/** What `fail` did: whether it made the run's row, whether it failed anything (not if the run or step was done). */
export interface FailOutcome {
  readonly failed: boolean;
  readonly runCreated: boolean;
}

/** A step row as it is now, read by a delivery whose commit lost. */
export interface RecordedStep {
  /** `absent`: the run's first step, run unbegun, that no delivery has begun or committed yet. */
  readonly status: 'running' | 'done' | 'failed' | 'absent';
  readonly output: unknown;
}

/** A worker's steps begin and finish a few dozen at a time at most; a few workers' worth fits one statement. */
const MAX_BATCH = 64;
/** One statement runs while the next batch gathers; two at once keep a slow one from holding up the rest. */
const MAX_IN_FLIGHT = 2;

/**
 * $1..$7: run ids, workflows, tenants, step lists (jsonb arrays), steps,
 * re-driven (booleans), delivery numbers.
 *
 * Locks are taken in one order everywhere: the run's row, then the step's
 * (commit and a step's own transaction do the same), so begins and commits
 * of one run cannot deadlock; and the rows of a batch in run id order, so
 * two batches lock theirs in one order too. A run whose row another
 * transaction holds (a step running in its own transaction(), or a commit
 * under way) is `busy` and left untouched (SKIP LOCKED): that delivery
 * decides, and this one is retried later instead of holding up the whole
 * batch behind that lock.
 *
 * The run row is inserted `running` if absent. A `failed` run is set
 * `running` again (its deadline counted from now) only by a re-driven entry
 * (the operator's decision); any other delivery that meets it (a late
 * reclaim of an entry whose run another delivery failed and dead-lettered)
 * is answered `failed` and changes nothing. The step row is inserted with
 * the delivery's number as its attempts (a first step's first delivery ran
 * before any row, `runsUnbegun`), or set `running` with one more attempt
 * unless it is `done`. The step upsert always updates (a done row to
 * itself), so that RETURNING gives the row as it is now, never a snapshot
 * from before a commit that raced it. `run_created`: the run's row was
 * inserted, not updated, by this statement (`xmax = 0` on the row it
 * returns; a snapshot comparison would miss a row another begin inserted
 * concurrently), the run's start for the metrics. The run's age is read
 * from the row `free` locked, unless `run` just set it.
 */
const BEGIN = `WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::boolean[], $7::int[])
      AS i(run_id, workflow, tenant, steps, step, redriven, delivery)
  ), free AS (
    SELECT run_id, status, deadline_from FROM workflow_runs WHERE run_id IN (SELECT run_id FROM input)
     ORDER BY run_id FOR NO KEY UPDATE SKIP LOCKED
  ), busy AS (
    SELECT r.run_id FROM workflow_runs r
     WHERE r.run_id IN (SELECT run_id FROM input) AND r.run_id NOT IN (SELECT run_id FROM free)
  ), dead AS (
    SELECT f.run_id FROM free f JOIN input i ON i.run_id = f.run_id WHERE f.status = 'failed' AND NOT i.redriven
  ), go AS (
    SELECT * FROM input
     WHERE run_id NOT IN (SELECT run_id FROM busy) AND run_id NOT IN (SELECT run_id FROM dead)
  ), run AS (
    INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps)
    SELECT run_id, workflow, tenant, 'running', ARRAY(SELECT jsonb_array_elements_text(steps)) FROM go
     ORDER BY run_id
    ON CONFLICT (run_id) DO UPDATE
      SET status = 'running', error = NULL, finished_at = NULL, updated_at = now(), deadline_from = now()
      WHERE workflow_runs.status = 'failed'
    RETURNING run_id, deadline_from, (xmax = 0) AS inserted
  ), step AS (
    INSERT INTO workflow_steps (run_id, step, status, attempts)
    SELECT run_id, step, 'running', GREATEST(delivery, 1) FROM go ORDER BY run_id
    ON CONFLICT (run_id, step) DO UPDATE
      SET status = CASE WHEN workflow_steps.status = 'done' THEN 'done' ELSE 'running' END,
          attempts = workflow_steps.attempts + CASE WHEN workflow_steps.status = 'done' THEN 0 ELSE 1 END,
          error = CASE WHEN workflow_steps.status = 'done' THEN workflow_steps.error END,
          finished_at = CASE WHEN workflow_steps.status = 'done' THEN workflow_steps.finished_at END,
          started_at = CASE WHEN workflow_steps.status = 'done' THEN workflow_steps.started_at ELSE now() END
    RETURNING run_id, step, status, output, attempts
  )
  SELECT i.run_id, i.step,
         CASE WHEN b.run_id IS NOT NULL THEN 'busy' WHEN d.run_id IS NOT NULL THEN 'failed' ELSE s.status END
           AS status,
         s.output, COALESCE(s.attempts, 0) AS attempts,
         (extract(epoch FROM now() - COALESCE(r.deadline_from, f.deadline_from, now())) * 1000)::float8 AS age_ms,
         COALESCE(r.inserted, false) AS run_created
    FROM input i
    LEFT JOIN busy b ON b.run_id = i.run_id
    LEFT JOIN dead d ON d.run_id = i.run_id
    LEFT JOIN step s ON s.run_id = i.run_id AND s.step = i.step
    LEFT JOIN run r ON r.run_id = i.run_id
    LEFT JOIN free f ON f.run_id = i.run_id`;

/**
 * A name checked against SQL_NAME, always double-quoted: a table or column
 * named like a keyword (`user`, `order`) needs it, and quoting every name
 * keeps that from depending on a list of keywords.
 */
function ident(name: string): string {
  if (!SQL_NAME.test(name)) throw new Error(`not a table or column name: ${JSON.stringify(name)}`);
  return `"${name}"`;
}

/** A serialized output bigger than this is refused: outputs ride in every later step's entry (`state`). */
export const MAX_OUTPUT_BYTES = 256 * 1024;

/** A step's commit as JSON text, serialized before it joins a batch: a value that cannot be fails only its own step. */
export interface SerializedCommit {
  readonly runId: string;
  readonly step: string;
  readonly output: string;
  readonly runOutput: string | null;
  readonly inserts: readonly { readonly table: string; readonly columns: readonly string[]; readonly row: string }[];
  /** Each outbox message as JSON text ({topic, dedupe_key, payload, traceparent?}). */
  readonly outbox: readonly string[];
  /** One of them has a `traceparent` (tracing is on): only then does the commit name the column (commitStatement). */
  readonly traced: boolean;
  /** The outbox dedupe keys (the batch keeps two commits of one key apart). */
  readonly dedupeKeys: readonly string[];
  /** StepCommit's `unbegun`, the step list as JSON text. */
  readonly unbegun: { readonly workflow: string; readonly tenant: string; readonly steps: string } | null;
}

function toJson(value: unknown, what: string): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new NonRetryableStepError(
      `${what} is not serializable: ${(err as Error).message}`,
      'output_not_serializable',
      {
        cause: err,
      },
    );
  }
  return text ?? 'null';
}

/**
 * The step's commit as JSON text, or the step's own non-retryable failure:
 * `output_not_serializable` (a BigInt, a cycle), `output_too_large` (past
 * MAX_OUTPUT_BYTES). Done before batching, so one bad step never fails the
 * others it would have been committed with.
 */
export function serializeCommit(c: StepCommit): SerializedCommit {
  const output = toJson(c.output ?? null, "the step's output");
  const bytes = Buffer.byteLength(output);
  if (bytes > MAX_OUTPUT_BYTES)
    throw new NonRetryableStepError(
      `the step's output is ${bytes} bytes serialized, over the ${MAX_OUTPUT_BYTES} allowed: keep large data in a table`,
      'output_too_large',
    );
  return {
    runId: c.runId,
    step: c.step,
    output,
    runOutput: c.runOutput === undefined ? null : toJson(c.runOutput, "the run's output"),
    inserts: c.inserts.map(({ table, row }) => {
      const columns = Object.keys(row).sort();
      for (const name of [table, ...columns]) ident(name);
      return { table, columns, row: toJson(row, `a row for ${table}`) };
    }),
    outbox: c.outbox.map((m) =>
      toJson(
        { topic: m.topic, dedupe_key: m.dedupeKey, payload: m.payload, traceparent: m.traceparent },
        `outbox message ${m.dedupeKey}`,
      ),
    ),
    dedupeKeys: c.outbox.map((m) => m.dedupeKey),
    traced: c.outbox.some((m) => m.traceparent !== undefined),
    unbegun: c.unbegun
      ? { workflow: c.unbegun.workflow, tenant: c.unbegun.tenant, steps: JSON.stringify(c.unbegun.steps) }
      : null,
  };
}

/** A JSON array from elements that are JSON text already. */
function jsonArray(items: readonly string[]): string {
  return `[${items.join(',')}]`;
}

/**
 * The commit statement and its parameters for `steps`. Each run's row is
 * locked before its step's (the `locked` CTE feeds the guard UPDATE), the
 * order `begin` and a step's own transaction take them in.
 *
 * A step run unbegun (a run's first step on its first delivery) whose run has
 * no row commits by creating both rows (`made`, `made_steps`): the run's
 * `running`, or `done` with its output when that was its only step, and the
 * step's `done` with one attempt. Its run's row being absent is its guard: a
 * run another delivery began meanwhile has a row (`locked`, or a conflict on
 * an insert not yet committed, which waits for it), and then the step row
 * guards as for any step. `made` says which winners created their run.
 *
 * The outbox insert names `outbox.traceparent` only when a message of the
 * batch has one, which only a traced worker writes: untraced, the statement
 * is the one from before the column existed, so a new worker commits against
 * a database not migrated yet (a rolling upgrade) as the old one did
 * (docs/operations.md, Upgrading: migrate before turning traces on).
 */
function commitStatement(steps: readonly SerializedCommit[]): { sql: string; params: unknown[] } {
  const params: unknown[] = [
    steps.map((s) => s.runId),
    steps.map((s) => s.step),
    steps.map((s) => s.output),
    steps.map((s) => s.runOutput !== null),
    steps.map((s) => s.runOutput),
    jsonArray(steps.flatMap((s, i) => s.outbox.map((m) => `{"k":${i + 1},"m":${m}}`))),
    steps.map((s) => s.unbegun !== null),
    steps.map((s) => s.unbegun?.workflow ?? null),
    steps.map((s) => s.unbegun?.tenant ?? null),
    steps.map((s) => s.unbegun?.steps ?? null),
  ];
  // One INSERT per table and column set, fed by the rows of every winner that wrote such rows.
  const groups = new Map<string, { table: string; columns: readonly string[]; rows: string[] }>();
  steps.forEach((s, i) => {
    for (const { table, columns, row } of s.inserts) {
      const key = `${table}(${columns.join(',')})`;
      let g = groups.get(key);
      if (!g) groups.set(key, (g = { table, columns, rows: [] }));
      g.rows.push(`{"k":${i + 1},"r":${row}}`);
    }
  });
  const inserts = [...groups.values()].map((g, n) => {
    params.push(jsonArray(g.rows));
    const cols = g.columns.map(ident);
    return `, insert_${n} AS (
    INSERT INTO ${ident(g.table)} (${cols.join(', ')})
    SELECT ${cols.map((c) => `p.${c}`).join(', ')}
      FROM jsonb_array_elements($${params.length}::jsonb) e
      JOIN winners w ON w.k = (e->>'k')::bigint
      CROSS JOIN LATERAL jsonb_populate_record(NULL::${ident(g.table)}, e->'r') p
    ON CONFLICT DO NOTHING
  )`;
  });
  const traced = steps.some((s) => s.traced);
  const sql = `WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::boolean[], $5::jsonb[],
                         $7::boolean[], $8::text[], $9::text[], $10::jsonb[]) WITH ORDINALITY
      AS i(run_id, step, output, last, run_output, unbegun, workflow, tenant, steps, k)
  ), locked AS (
    SELECT r.run_id FROM workflow_runs r WHERE r.run_id IN (SELECT run_id FROM input)
     ORDER BY r.run_id FOR NO KEY UPDATE
  ), made AS (
    INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, output, finished_at)
    SELECT i.run_id, i.workflow, i.tenant, CASE WHEN i.last THEN 'done' ELSE 'running' END,
           ARRAY(SELECT jsonb_array_elements_text(i.steps)), CASE WHEN i.last THEN i.run_output END,
           CASE WHEN i.last THEN now() END
      FROM input i
     WHERE i.unbegun AND i.run_id NOT IN (SELECT run_id FROM locked)
     ORDER BY i.run_id
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
  ), made_steps AS (
    INSERT INTO workflow_steps (run_id, step, status, attempts, output, finished_at)
    SELECT i.run_id, i.step, 'done', 1, i.output, now() FROM input i JOIN made m ON m.run_id = i.run_id
    RETURNING run_id
  ), updated AS (
    UPDATE workflow_steps s
       SET status = 'done', output = i.output, error = NULL, finished_at = now()
      FROM input i JOIN locked l ON l.run_id = i.run_id
     WHERE s.run_id = i.run_id AND s.step = i.step AND s.status = 'running'
    RETURNING i.k, i.run_id, i.last, i.run_output, s.attempts
  ), runs AS (
    UPDATE workflow_runs r
       SET updated_at = now(),
           status = CASE WHEN w.last THEN 'done' ELSE r.status END,
           output = CASE WHEN w.last THEN w.run_output ELSE r.output END,
           finished_at = CASE WHEN w.last THEN now() ELSE r.finished_at END
      FROM updated w
     WHERE r.run_id = w.run_id
  ), winners AS (
    SELECT k, false AS made, attempts FROM updated
    UNION ALL
    SELECT i.k, true, 1 FROM input i JOIN made_steps m ON m.run_id = i.run_id
  )${inserts.join('')}, message AS (
    INSERT INTO outbox (topic, dedupe_key, payload${traced ? ', traceparent' : ''})
    SELECT e->'m'->>'topic', e->'m'->>'dedupe_key', e->'m'->'payload'${traced ? ", e->'m'->>'traceparent'" : ''}
      FROM jsonb_array_elements($6::jsonb) e
      JOIN winners w ON w.k = (e->>'k')::bigint
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
  )
  SELECT w.k, w.made, w.attempts FROM winners w
   CROSS JOIN (SELECT count(pg_notify('${OUTBOX_CHANNEL}', id::text)) FROM message) AS woken`;
  return { sql, params };
}

/**
 * Failing a run, in one transaction, run row first (the order begin, commit
 * and a step's own transaction take): FAIL_RUN_ROW makes the row if absent
 * ($1 run, $2 workflow, $3 tenant, $4 steps (jsonb), $5 error), LOCK_RUN locks
 * it, and FAIL_STEP, a statement begun under that lock (its snapshot sees any
 * commit that held the lock before it), fails the step and the run ($1 run,
 * $2 step, $3 error). A step another delivery committed is not failed, nor
 * its run: that delivery's next step carries the run on.
 */
const FAIL_RUN_ROW = `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, finished_at)
    VALUES ($1, $2, $3, 'failed', ARRAY(SELECT jsonb_array_elements_text($4::jsonb)), $5, now())
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id`;
const LOCK_RUN = `SELECT 1 FROM workflow_runs WHERE run_id = $1 FOR NO KEY UPDATE`;
/** A step run unbegun has no row to fail: one is made, `running` with its attempts, for FAIL_STEP to fail. */
const UNBEGUN_STEP_ROW = `INSERT INTO workflow_steps (run_id, step, status, attempts) VALUES ($1, $2, 'running', $3)
    ON CONFLICT (run_id, step) DO NOTHING`;
const FAIL_STEP = `WITH step AS (
    UPDATE workflow_steps SET status = 'failed', error = $3, finished_at = now()
     WHERE run_id = $1 AND step = $2 AND status <> 'done'
    RETURNING 1
  )
  UPDATE workflow_runs
     SET status = 'failed', error = $3, updated_at = now(), finished_at = now()
   WHERE run_id = $1 AND status <> 'done'
     AND NOT EXISTS (SELECT 1 FROM workflow_steps WHERE run_id = $1 AND step = $2 AND status = 'done')
  RETURNING run_id`;

/**
 * A failed commit batch runs each step alone only when one step's own rows or
 * values can be what failed it: SQLSTATE classes 22 (data), 23 (constraint),
 * 42 (a table, column or shape refused), 40001 (serialization), or an error
 * with no SQLSTATE that is not PostgreSQL being away. Anything else (08
 * connection, 53 resources, 57 cancelled or shut down, 40P01 deadlock, 55P03
 * lock not available) would fail the same way item by item, and re-running
 * the items alone would pile load on a database already in trouble: the batch
 * fails as a whole, and each of its steps is redelivered.
 */
export function isolateCommitFailure(err: unknown): boolean {
  const code = errorCodeOf(err);
  if (!/^[0-9A-Z]{5}$/.test(code)) return !isConnectionError(err);
  return /^(22|23|42)/.test(code) || code === '40001';
}

/**
 * SQLSTATE of an insert() whose shape PostgreSQL refuses. An undefined table or column (42P01, 42703) is not one:
 * a step's table may be migrated after the worker rolls out, so it is retried until it comes (or MAX_DELIVERIES).
 */
const INSERT_FAULTS = new Set(['42601']);

/**
 * In a commit run alone: a syntax error of a step that wrote insert() rows is
 * the step's own failure (`insert_failed`, not retried); the engine's own
 * statement has no other source of one.
 */
function insertFault(err: unknown, step: SerializedCommit): NonRetryableStepError | undefined {
  const code = errorCodeOf(err);
  if (step.inserts.length === 0 || !INSERT_FAULTS.has(code)) return undefined;
  const message = err instanceof Error ? err.message : String(err);
  const tables = [...new Set(step.inserts.map((i) => i.table))].join(', ');
  return new NonRetryableStepError(`insert into ${tables}: ${message}`, 'insert_failed', { cause: err });
}

/**
 * The engine's record in PostgreSQL (workflow_runs, workflow_steps): the
 * step row is the commit guard. `begin` and `commit` are group-committed
 * (MicroBatcher, as SummaryWriter does): the deliveries of a read batch
 * begin in one statement, and the steps that finish together commit in one,
 * so a crowd of steps costs two round trips, not two each. A commit is one
 * statement with data-modifying CTEs: the guard UPDATE (`status = 'running'`
 * → `done`) returns the winners, and only their `insert` rows, outbox rows
 * (with the relay's wake-up) and run updates are written. A step that opened
 * its own transaction runs the same statement inside it.
 */
@Injectable()
export class WorkflowStore {
  private readonly begins = new MicroBatcher<BeginStep, BegunStep>({
    run: (batch) => this.beginBatch(batch),
    maxBatch: MAX_BATCH,
    maxInFlight: MAX_IN_FLIGHT,
    // One statement must not upsert one row twice (ON CONFLICT refuses), nor touch one run twice.
    keys: (b) => [b.runId.toLowerCase()],
  });
  private readonly commits = new MicroBatcher<SerializedCommit, CommitResult>({
    run: (batch) => this.commitBatch(this.dataSource.manager, batch),
    maxBatch: MAX_BATCH,
    maxInFlight: MAX_IN_FLIGHT,
    keys: (c) => [c.runId.toLowerCase(), ...c.dedupeKeys.map((k) => `outbox:${k}`)],
    isolateFailures: isolateCommitFailure,
  });

  constructor(private readonly dataSource: DataSource) {}

  /** The step's row set `running` (one more attempt) unless done, the run's created if absent. */
  begin(step: BeginStep): Promise<BegunStep> {
    return this.begins.submit(step);
  }

  /**
   * Commits the step unless another delivery did (group commit). Serialized
   * first: a NonRetryableStepError (serializeCommit) fails this step alone.
   */
  async commit(step: StepCommit): Promise<CommitResult> {
    return this.commits.submit(serializeCommit(step));
  }

  /**
   * What the step's row holds now (a delivery that lost reads the winner's
   * output): `done` with the output; `failed` when the delivery that beat
   * this one failed the step (it decided for the run); `running` or `absent`
   * when another delivery holds it or has not begun it yet (a first step run
   * unbegun lost its run's row to a begin: that delivery decides).
   */
  async recordedOutput(runId: string, step: string): Promise<RecordedStep> {
    const rows: { status: RecordedStep['status']; output: unknown }[] = await this.dataSource.query(
      `SELECT status, output FROM workflow_steps WHERE run_id = $1 AND step = $2`,
      [runId, step],
    );
    return rows[0] ? { status: rows[0].status, output: rows[0].output } : { status: 'absent', output: undefined };
  }

  /**
   * Which of these runs have a row (begun, committed or failed by some delivery): one read for a batch, so that
   * a run's first step runs unbegun only when nothing of its run is recorded yet (a second start's entry is not).
   */
  async runsWithRows(runIds: readonly string[]): Promise<ReadonlySet<string>> {
    const rows: { run_id: string }[] = await this.dataSource.query(
      `SELECT run_id FROM workflow_runs WHERE run_id = ANY($1::uuid[])`,
      [runIds],
    );
    return new Set(rows.map((r) => r.run_id));
  }

  /**
   * Marks the step and its run failed with `error` (the run row made if absent, the step's too when it ran
   * unbegun); a done step or run stays done. `failed` false: the run was done, or its step was (nothing failed).
   */
  async fail(f: FailedStep): Promise<FailOutcome> {
    return this.dataSource.transaction(async (m) => {
      const made: unknown[] = await m.query(FAIL_RUN_ROW, [
        f.runId,
        f.workflow,
        f.tenant,
        JSON.stringify(f.steps),
        f.error,
      ]);
      await m.query(LOCK_RUN, [f.runId]);
      if (f.unbegunAttempts !== undefined) await m.query(UNBEGUN_STEP_ROW, [f.runId, f.step, f.unbegunAttempts]);
      // An UPDATE ... RETURNING answers [rows, count] through TypeORM's postgres driver.
      const [failed] = await m.query<[unknown[], number]>(FAIL_STEP, [f.runId, f.step, f.error]);
      return { failed: made.length > 0 || failed.length > 0, runCreated: made.length > 0 };
    });
  }

  /**
   * Opens a transaction for a step that asked for one, taking its run row's
   * lock and then its step row's (the order begin and commit take them in):
   * another delivery of the step finds its run `busy` at begin and is retried
   * later, instead of writing beside it or holding up a batch of begins.
   */
  async openTransaction(runId: string, step: string): Promise<StepTransaction> {
    const runner: QueryRunner = this.dataSource.createQueryRunner();
    await runner.connect();
    let open = false;
    const rollback = async (): Promise<void> => {
      try {
        if (open) await runner.rollbackTransaction();
      } finally {
        open = false;
        if (!runner.isReleased) await runner.release();
      }
    };
    try {
      await runner.startTransaction();
      open = true;
      await runner.query(`SELECT 1 FROM workflow_runs WHERE run_id = $1 FOR NO KEY UPDATE`, [runId]);
      await runner.query(`SELECT 1 FROM workflow_steps WHERE run_id = $1 AND step = $2 FOR UPDATE`, [runId, step]);
    } catch (err) {
      await rollback().catch(() => undefined);
      throw err;
    }
    return {
      manager: runner.manager,
      commit: async (s) => {
        try {
          const [outcome] = await this.commitBatch(runner.manager, [serializeCommit(s)]);
          if (outcome.outcome === 'won') {
            await runner.commitTransaction();
            open = false;
          }
          return outcome;
        } finally {
          // A rollback that fails (the connection gone) must not hide the commit's own outcome or error.
          await rollback().catch(() => undefined);
        }
      },
      rollback,
    };
  }

  private async beginBatch(batch: readonly BeginStep[]): Promise<BegunStep[]> {
    const rows: {
      run_id: string;
      step: string;
      status: string;
      output: unknown;
      attempts: number;
      age_ms: number;
      run_created: boolean;
    }[] = await this.dataSource.query(BEGIN, [
      batch.map((b) => b.runId),
      batch.map((b) => b.workflow),
      batch.map((b) => b.tenant),
      batch.map((b) => JSON.stringify(b.steps)),
      batch.map((b) => b.step),
      batch.map((b) => b.redriven === true),
      batch.map((b) => b.delivery),
    ]);
    const byKey = new Map(rows.map((r) => [`${r.run_id}/${r.step}`, r]));
    return batch.map((b) => {
      const r = byKey.get(`${b.runId.toLowerCase()}/${b.step}`);
      if (!r) throw new Error(`begin returned no row for step ${b.step} of run ${b.runId}`);
      return {
        status: r.status === 'done' || r.status === 'busy' || r.status === 'failed' ? r.status : 'running',
        output: r.output,
        attempts: Number(r.attempts),
        runAgeMs: Math.max(0, Number(r.age_ms)),
        runCreated: r.run_created === true,
      };
    });
  }

  private async commitBatch(manager: EntityManager, batch: readonly SerializedCommit[]): Promise<CommitResult[]> {
    const { sql, params } = commitStatement(batch);
    let rows: { k: string | number; made: boolean; attempts: number }[];
    try {
      rows = await manager.query(sql, params);
    } catch (err) {
      // Alone (isolated, or a step's own transaction): a fault of its own insert() rows is that step's.
      throw (batch.length === 1 && insertFault(err, batch[0])) || err;
    }
    const won = new Map(rows.map((r) => [Number(r.k), r]));
    return batch.map((_, i) => {
      const w = won.get(i + 1);
      return w === undefined
        ? { outcome: 'lost', runCreated: false, attempts: 0 }
        : { outcome: 'won', runCreated: w.made === true, attempts: Number(w.attempts) };
    });
  }
}
