import { Injectable } from '@nestjs/common';
import { DataSource, type EntityManager } from 'typeorm';
import type { RunRow, StepRow } from './run-status';

/** What PostgreSQL holds of one run: its row, its step rows, and a `summaries` row when asked for. */
export interface StoredRun {
  readonly row?: RunRow;
  readonly stepRows: readonly StepRow[];
  readonly summary?: { readonly tenant: string; readonly summary: string };
}

interface Answer {
  run: RunRow | null;
  steps: StepRow[] | null;
  summary: { tenant: string; summary: string } | null;
}

/*
 * One statement, one round trip: the run's row, its steps, and (for the
 * summaries workflow) the `summaries` row that a job finished before workflows
 * existed left behind. The caller checks the tenant: a row of another tenant
 * is an answer too (not found), not a reason to look further.
 */
const RUN = `(SELECT row_to_json(r) FROM (
    SELECT workflow, tenant, status, steps, output, error FROM workflow_runs WHERE run_id = $1) r) AS run`;
const STEPS = `(SELECT json_agg(json_build_object('step', step, 'status', status, 'attempts', attempts, 'output', output)
    ORDER BY started_at, step) FROM workflow_steps WHERE run_id = $1) AS steps`;
const SUMMARY = `(SELECT row_to_json(s) FROM (SELECT tenant, summary FROM summaries WHERE job_id = $1) s) AS summary`;

/**
 * I/O only: reads one run, outside any unit of work (a GET), in the app's
 * DataSource unless given the EntityManager to read in. A provider of
 * WorkflowClientModule, so a test can give it a DataSource that is down.
 */
@Injectable()
export class WorkflowRunsReader {
  constructor(private readonly dataSource: DataSource) {}

  async find(runId: string, withSummary: boolean, em: EntityManager = this.dataSource.manager): Promise<StoredRun> {
    const sql = `SELECT ${RUN}, ${STEPS}, ${withSummary ? SUMMARY : 'NULL::json AS summary'}`;
    const [answer] = await em.query<Answer[]>(sql, [runId]);
    return {
      ...(answer.run ? { row: answer.run } : {}),
      stepRows: answer.steps ?? [],
      ...(answer.summary ? { summary: answer.summary } : {}),
    };
  }
}
