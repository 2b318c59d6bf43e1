import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The workflow engine's record (libs/workflows): a run's row appears when its
 * first step is first delivered (before that, the run is queued: only its
 * Redis record says it exists), a step's row when that step is first
 * delivered. The step row is the commit guard: a step commits by turning its
 * own row from `running` to `done` in the transaction that writes its output,
 * its writes, its outbox rows and the run's next state, so however often it
 * is delivered it commits once.
 *
 * `steps` names the workflow's steps in order, as the worker that started
 * the run declared them: what GET /v1/runs lists as pending before a step
 * has a row (the api does not load the workflows' classes).
 *
 * `deadline_from` is what a workflow's deadline (`deadlineS`) counts from:
 * the run's first delivery, and again each time a failed run is re-driven
 * (else a re-driven run would be past its deadline at once).
 *
 * `finished_at` is set when a run ends (done or failed); the retention sweep
 * deletes finished runs past WORKFLOW_RUN_RETENTION_DAYS by it, their steps
 * with them.
 */
export class Workflows1764979200000 implements MigrationInterface {
  name = 'Workflows1764979200000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE workflow_runs (
        run_id      uuid PRIMARY KEY,
        workflow    text NOT NULL,
        tenant      text NOT NULL,
        status      text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
        steps       text[] NOT NULL,
        output      jsonb,
        error       text,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz,
        deadline_from timestamptz NOT NULL DEFAULT now()
      )`);
    await q.query(
      `CREATE INDEX workflow_runs_finished_at_idx ON workflow_runs (finished_at) WHERE finished_at IS NOT NULL`,
    );
    await q.query(
      `CREATE INDEX workflow_runs_failed_idx ON workflow_runs (workflow, updated_at) WHERE status = 'failed'`,
    );
    await q.query(`
      CREATE TABLE workflow_steps (
        run_id      uuid NOT NULL REFERENCES workflow_runs (run_id) ON DELETE CASCADE,
        step        text NOT NULL,
        status      text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
        attempts    integer NOT NULL DEFAULT 0,
        output      jsonb,
        error       text,
        started_at  timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz,
        PRIMARY KEY (run_id, step)
      )`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE workflow_steps`);
    await q.query(`DROP TABLE workflow_runs`);
  }
}
