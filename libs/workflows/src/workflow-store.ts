import { Injectable } from '@nestjs/common';
import { MicroBatcher } from '@app/batching';
import { errorCodeOf, type NewOutboxMessage, OUTBOX_CHANNEL } from '@app/persistence';
import { DataSource, type EntityManager, type QueryRunner } from 'typeorm';
import type { StepInsert } from './step-context';
import { SQL_NAME } from './step-context';

/** What a delivery tells `begin`. */
export interface BeginStep {
  readonly runId: string;
  readonly workflow: string;
  readonly tenant: string;
  /** The workflow's steps in order: the run row's `steps`. */
  readonly steps: readonly string[];
  readonly step: string;
}

/** The step's row after `begin`, and its run's. */
export interface BegunStep {
  /** `done`: committed by an earlier delivery (its `output` is the recorded one); else now `running`. */
  readonly status: 'running' | 'done';
  readonly output: unknown;
  readonly attempts: number;
  /** Since the run's row was created, by PostgreSQL's clock. */
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
}

/** `won`: this delivery committed the step; `lost`: another delivery had. */
export type CommitOutcome = 'won' | 'lost';

/** A step transaction opened for `StepContext.transaction()`. */
export interface StepTransaction {
  readonly manager: EntityManager;
  /** Runs the commit statement for this step in the transaction and commits it; `lost`: rolled back instead. */
  commit(step: StepCommit): Promise<CommitOutcome>;
  /** Rolls back (idempotent) and releases the connection. */
  rollback(): Promise<void>;
}

/** What fails a run for good. */
export interface FailedStep extends BeginStep {
  readonly error: string;
}

/** A worker's steps begin and finish a few dozen at a time at most; a few workers' worth fits one statement. */
const MAX_BATCH = 64;
/** One statement runs while the next batch gathers; two at once keep a slow one from holding up the rest. */
const MAX_IN_FLIGHT = 2;

/**
 * $1..$5: run ids, workflows, tenants, step lists (jsonb arrays), steps. The run row is inserted `running` if
 * absent (a failed run, re-driven, is `running` again); the step row inserted, or set `running` with one more
 * attempt, unless it is `done`. The final SELECT reads the rows as they were before the statement (a CTE's
 * changes are not visible to its siblings), so a step it did not touch (done) and a run it did not touch are
 * read from the tables. `run_created`: the run's row was inserted, not updated, by this statement (`xmax = 0`
 * on the row it returns; a snapshot comparison would miss a row another begin inserted concurrently), the run's
 * start for the metrics.
 */
const BEGIN = `WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::text[])
      AS i(run_id, workflow, tenant, steps, step)
  ), run AS (
    INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps)
    SELECT run_id, workflow, tenant, 'running', ARRAY(SELECT jsonb_array_elements_text(steps)) FROM input
    ON CONFLICT (run_id) DO UPDATE
      SET status = 'running', error = NULL, finished_at = NULL, updated_at = now()
      WHERE workflow_runs.status = 'failed'
    RETURNING run_id, created_at, (xmax = 0) AS inserted
  ), step AS (
    INSERT INTO workflow_steps (run_id, step, status, attempts)
    SELECT run_id, step, 'running', 1 FROM input
    ON CONFLICT (run_id, step) DO UPDATE
      SET status = 'running', attempts = workflow_steps.attempts + 1, error = NULL, finished_at = NULL,
          started_at = now()
      WHERE workflow_steps.status <> 'done'
    RETURNING run_id, step, attempts
  )
  SELECT i.run_id, i.step,
         CASE WHEN s.run_id IS NULL THEN old_s.status ELSE 'running' END AS status,
         CASE WHEN s.run_id IS NULL THEN old_s.output END AS output,
         COALESCE(s.attempts, old_s.attempts) AS attempts,
         (extract(epoch FROM now() - COALESCE(r.created_at, old_r.created_at)) * 1000)::float8 AS age_ms,
         COALESCE(r.inserted, false) AS run_created
    FROM input i
    LEFT JOIN step s ON s.run_id = i.run_id AND s.step = i.step
    LEFT JOIN workflow_steps old_s ON old_s.run_id = i.run_id AND old_s.step = i.step
    LEFT JOIN run r ON r.run_id = i.run_id
    LEFT JOIN workflow_runs old_r ON old_r.run_id = i.run_id`;

/** A few of PostgreSQL's reserved words a table or column might be named: these are quoted, the rest are not. */
const RESERVED = new Set([
  'all', 'analyse', 'analyze', 'and', 'any', 'array', 'as', 'asc', 'both', 'case', 'cast', 'check', 'collate',
  'column', 'constraint', 'create', 'current_date', 'current_role', 'current_time', 'current_timestamp',
  'current_user', 'default', 'desc', 'distinct', 'do', 'else', 'end', 'except', 'false', 'fetch', 'for', 'foreign',
  'from', 'grant', 'group', 'having', 'in', 'initially', 'intersect', 'into', 'lateral', 'leading', 'limit',
  'localtime', 'localtimestamp', 'not', 'null', 'offset', 'on', 'only', 'or', 'order', 'placing', 'primary',
  'references', 'returning', 'select', 'session_user', 'some', 'symmetric', 'table', 'then', 'to', 'trailing',
  'true', 'union', 'unique', 'user', 'using', 'variadic', 'when', 'where', 'window', 'with',
]); // prettier-ignore

/** A name checked against SQL_NAME, quoted when it is a reserved word (else bare, as in hand-written SQL). */
function ident(name: string): string {
  if (!SQL_NAME.test(name)) throw new Error(`not a table or column name: ${JSON.stringify(name)}`);
  return RESERVED.has(name) ? `"${name}"` : name;
}

/** The commit statement and its parameters for `steps`. */
function commitStatement(steps: readonly StepCommit[]): { sql: string; params: unknown[] } {
  const params: unknown[] = [
    steps.map((s) => s.runId),
    steps.map((s) => s.step),
    steps.map((s) => JSON.stringify(s.output ?? null)),
    steps.map((s) => s.runOutput !== undefined),
    steps.map((s) => (s.runOutput === undefined ? null : JSON.stringify(s.runOutput))),
    JSON.stringify(
      steps.flatMap((s, i) =>
        s.outbox.map((m) => ({ k: i + 1, topic: m.topic, dedupe_key: m.dedupeKey, payload: m.payload })),
      ),
    ),
  ];
  // One INSERT per table and column set, fed by the rows of every winner that wrote such rows.
  const groups = new Map<string, { table: string; columns: string[]; rows: { k: number; r: unknown }[] }>();
  steps.forEach((s, i) => {
    for (const { table, row } of s.inserts) {
      const columns = Object.keys(row).sort();
      const key = `${table}(${columns.join(',')})`;
      let g = groups.get(key);
      if (!g) groups.set(key, (g = { table, columns, rows: [] }));
      g.rows.push({ k: i + 1, r: row });
    }
  });
  const inserts = [...groups.values()].map((g, n) => {
    params.push(JSON.stringify(g.rows));
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
  const sql = `WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::boolean[], $5::jsonb[]) WITH ORDINALITY
      AS i(run_id, step, output, last, run_output, k)
  ), winners AS (
    UPDATE workflow_steps s
       SET status = 'done', output = i.output, error = NULL, finished_at = now()
      FROM input i
     WHERE s.run_id = i.run_id AND s.step = i.step AND s.status = 'running'
    RETURNING i.k, i.run_id, i.last, i.run_output
  ), runs AS (
    UPDATE workflow_runs r
       SET updated_at = now(),
           status = CASE WHEN w.last THEN 'done' ELSE r.status END,
           output = CASE WHEN w.last THEN w.run_output ELSE r.output END,
           finished_at = CASE WHEN w.last THEN now() ELSE r.finished_at END
      FROM winners w
     WHERE r.run_id = w.run_id
  )${inserts.join('')}, message AS (
    INSERT INTO outbox (topic, dedupe_key, payload)
    SELECT e->>'topic', e->>'dedupe_key', e->'payload'
      FROM jsonb_array_elements($6::jsonb) e
      JOIN winners w ON w.k = (e->>'k')::bigint
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
  )
  SELECT w.k FROM winners w
   CROSS JOIN (SELECT count(pg_notify('${OUTBOX_CHANNEL}', id::text)) FROM message) AS woken`;
  return { sql, params };
}

/** $1 run, $2 workflow, $3 tenant, $4 steps (jsonb), $5 step or null, $6 error. */
const FAIL = `WITH run AS (
    INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, finished_at)
    VALUES ($1, $2, $3, 'failed', ARRAY(SELECT jsonb_array_elements_text($4::jsonb)), $6, now())
    ON CONFLICT (run_id) DO UPDATE
      SET status = 'failed', error = $6, updated_at = now(), finished_at = now()
      WHERE workflow_runs.status <> 'done'
    RETURNING run_id
  ), step AS (
    UPDATE workflow_steps SET status = 'failed', error = $6, finished_at = now()
     WHERE run_id = $1 AND step = $5 AND status <> 'done'
  )
  SELECT count(*)::int AS marked FROM run`;

/** Errors of one row's data (SQLSTATE classes 22 and 23: a bad value, a constraint): worth writing the rest alone. */
function isRowError(err: unknown): boolean {
  return /^2[23]/.test(errorCodeOf(err));
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
  private readonly commits = new MicroBatcher<StepCommit, CommitOutcome>({
    run: (batch) => this.commitBatch(this.dataSource.manager, batch),
    maxBatch: MAX_BATCH,
    maxInFlight: MAX_IN_FLIGHT,
    keys: (c) => [c.runId.toLowerCase(), ...c.outbox.map((m) => `outbox:${m.dedupeKey}`)],
    isolateFailures: isRowError,
  });

  constructor(private readonly dataSource: DataSource) {}

  /** The step's row set `running` (one more attempt) unless done, the run's created if absent. */
  begin(step: BeginStep): Promise<BegunStep> {
    return this.begins.submit(step);
  }

  /** Commits the step unless another delivery did (group commit). */
  commit(step: StepCommit): Promise<CommitOutcome> {
    return this.commits.submit(step);
  }

  /** What the step's committed row holds (a delivery that lost reads the winner's output). */
  async recordedOutput(runId: string, step: string): Promise<unknown> {
    const rows: { output: unknown }[] = await this.dataSource.query(
      `SELECT output FROM workflow_steps WHERE run_id = $1 AND step = $2 AND status = 'done'`,
      [runId, step],
    );
    if (rows.length === 0) throw new Error(`step ${step} of run ${runId} lost its commit but has no output`);
    return rows[0].output;
  }

  /**
   * Marks the step and its run failed with `error` (the run row made if absent); a done step or run stays done.
   * False: the run was done (nothing failed).
   */
  async fail(f: FailedStep): Promise<boolean> {
    const rows: { marked: number }[] = await this.dataSource.query(FAIL, [
      f.runId,
      f.workflow,
      f.tenant,
      JSON.stringify(f.steps),
      f.step,
      f.error,
    ]);
    return rows[0]?.marked === 1;
  }

  /**
   * Opens a transaction for a step that asked for one, taking its row's lock
   * first: another delivery of the step waits for this one's outcome instead
   * of writing beside it.
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
      await runner.query(`SELECT 1 FROM workflow_steps WHERE run_id = $1 AND step = $2 FOR UPDATE`, [runId, step]);
    } catch (err) {
      await rollback().catch(() => undefined);
      throw err;
    }
    return {
      manager: runner.manager,
      commit: async (s) => {
        try {
          const [outcome] = await this.commitBatch(runner.manager, [s]);
          if (outcome === 'won') {
            await runner.commitTransaction();
            open = false;
          }
          return outcome;
        } finally {
          await rollback();
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
    ]);
    const byKey = new Map(rows.map((r) => [`${r.run_id}/${r.step}`, r]));
    return batch.map((b) => {
      const r = byKey.get(`${b.runId.toLowerCase()}/${b.step}`);
      if (!r) throw new Error(`begin returned no row for step ${b.step} of run ${b.runId}`);
      return {
        status: r.status === 'done' ? 'done' : 'running',
        output: r.output,
        attempts: Number(r.attempts),
        runAgeMs: Math.max(0, Number(r.age_ms)),
        runCreated: r.run_created === true,
      };
    });
  }

  private async commitBatch(manager: EntityManager, batch: readonly StepCommit[]): Promise<CommitOutcome[]> {
    const { sql, params } = commitStatement(batch);
    const rows: { k: string | number }[] = await manager.query(sql, params);
    const won = new Set(rows.map((r) => Number(r.k)));
    return batch.map((_, i) => (won.has(i + 1) ? 'won' : 'lost'));
  }
}
