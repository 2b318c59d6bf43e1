/** What GET /v1/runs/<run_id> answers (INTERFACE.md, "Workflows"): the wire names, snake_case. */
export interface RunSnapshot {
  readonly run_id: string;
  readonly workflow: string;
  readonly status: 'queued' | 'running' | 'done' | 'failed';
  /** In the workflow's order; empty while the run is queued (the api does not load the workflows' classes). */
  readonly steps: readonly RunStepSnapshot[];
  /** When done: the steps' outputs merged in order. */
  readonly output?: unknown;
  /** When failed: why (the dead-letter reason, or the step's error). */
  readonly error?: string;
  /**
   * While a step's model call waits for its tenant's token limit (TENANT_TOKEN_LIMITS): which step, and until
   * when it waits (ISO 8601) before it tries again.
   */
  readonly waiting?: RunWait;
}

export interface RunWait {
  readonly reason: 'token_limit';
  readonly step: string;
  readonly until: string;
}

export interface RunStepSnapshot {
  readonly name: string;
  readonly status: 'pending' | 'running' | 'done' | 'failed';
  /** Deliveries that began the step; 0 while pending. */
  readonly attempts: number;
  readonly output?: unknown;
}

/** A `workflow_runs` row, as the worker writes it. */
export interface RunRow {
  readonly workflow: string;
  readonly tenant: string;
  readonly status: 'running' | 'done' | 'failed';
  readonly steps: readonly string[];
  readonly output: unknown;
  readonly error: string | null;
}

/** A `workflow_steps` row. */
export interface StepRow {
  readonly step: string;
  readonly status: 'running' | 'done' | 'failed';
  readonly attempts: number;
  readonly output: unknown;
}

/** A run's record in Redis (`{<tag>}:job:<run_id>`): written by the start, marked failed by the dead letter. */
export interface RunRecord {
  readonly tenant: string;
  /** Only on the shared queue. */
  readonly workflow?: string;
  readonly status?: 'failed';
  readonly error?: string;
  /** A wait for the token limit not over yet (the worker notes it on the record; the reader drops a past one). */
  readonly waiting?: RunWait;
}

/** One queue's answer for the run's record: what it holds (nothing: undefined), or that Redis did not answer. */
export type RecordFact =
  | { readonly unavailable?: false; readonly record?: RunRecord; readonly soleWorkflow?: string }
  | { readonly unavailable: true };

/** Everything one GET reads, PostgreSQL's part already known (a PostgreSQL failure answers before any of this). */
export interface RunFacts {
  readonly runId: string;
  /** The tenant asking. */
  readonly tenant: string;
  readonly row?: RunRow;
  readonly stepRows: readonly StepRow[];
  /** A summaries job done before workflows existed: its `summaries` row (looked up where summaries is registered). */
  readonly summary?: { readonly tenant: string; readonly summary: string; readonly workflow: string };
  /** The run's record in every registered queue (it is in one at most). */
  readonly records: readonly RecordFact[];
}

export type RunAnswer =
  | { readonly kind: 'found'; readonly run: RunSnapshot }
  | { readonly kind: 'not_found' }
  | { readonly kind: 'unavailable' };

const NOT_FOUND: RunAnswer = { kind: 'not_found' };

/**
 * Where a run stands, for its own tenant only, from what PostgreSQL and
 * Redis hold; everything else is not found, so run ids do not leak across
 * tenants. In order of authority:
 * 1. its `workflow_runs` row (the worker's record once the first step began):
 *    enough on its own, so a run with a row reads while Redis is down. A
 *    record marked failed beats a row still `running`: the dead letter marks
 *    the record in its own MULTI, while marking the row is best effort;
 * 2. a `summaries` row: a summaries job finished before workflows existed;
 * 3. its Redis record: queued, or failed when it was dead-lettered before any
 *    row was written (malformed, unknown workflow, invalid input).
 * Only when none of them is the tenant's and a queue's Redis did not answer is
 * the state unknown (unavailable): that record might have said queued.
 */
export function runAnswer(facts: RunFacts): RunAnswer {
  const { runId, tenant, row } = facts;
  const mine = facts.records.flatMap((f) =>
    !f.unavailable && f.record?.tenant === tenant ? [{ record: f.record, soleWorkflow: f.soleWorkflow }] : [],
  );
  if (row) {
    if (row.tenant !== tenant) return NOT_FOUND;
    const failedRecord = mine.find((m) => m.record.status === 'failed')?.record;
    const failed = row.status === 'failed' || (row.status === 'running' && failedRecord !== undefined);
    const status = failed ? 'failed' : row.status;
    const waiting = status === 'running' ? mine.find((m) => m.record.waiting)?.record.waiting : undefined;
    return {
      kind: 'found',
      run: {
        run_id: runId,
        workflow: row.workflow,
        status,
        steps: stepsOf(row.steps, facts.stepRows),
        ...(status === 'done' && row.output != null ? { output: row.output } : {}),
        ...(status === 'failed' ? { error: row.error ?? failedRecord?.error ?? 'failed' } : {}),
        ...(waiting ? { waiting } : {}),
      },
    };
  }
  if (facts.summary) {
    if (facts.summary.tenant !== tenant) return NOT_FOUND;
    const { workflow, summary } = facts.summary;
    return { kind: 'found', run: { run_id: runId, workflow, status: 'done', steps: [], output: { summary } } };
  }
  for (const { record, soleWorkflow } of mine) {
    const workflow = record.workflow ?? soleWorkflow;
    // A record on the shared queue that does not name its workflow was not written by a start: nothing to show.
    if (workflow === undefined) continue;
    const run: RunSnapshot =
      record.status === 'failed'
        ? { run_id: runId, workflow, status: 'failed', steps: [], error: record.error ?? 'failed' }
        : {
            run_id: runId,
            workflow,
            status: 'queued',
            steps: [],
            ...(record.waiting ? { waiting: record.waiting } : {}),
          };
    return { kind: 'found', run };
  }
  const anotherTenants = facts.records.some((f) => !f.unavailable && f.record !== undefined);
  if (!anotherTenants && facts.records.some((f) => f.unavailable)) return { kind: 'unavailable' };
  return NOT_FOUND;
}

/** The workflow's steps in order (a step without a row is pending), then any row of a step no longer declared. */
function stepsOf(names: readonly string[], rows: readonly StepRow[]): RunStepSnapshot[] {
  const byName = new Map(rows.map((r) => [r.step, r]));
  const view = (r: StepRow): RunStepSnapshot => ({
    name: r.step,
    status: r.status,
    attempts: r.attempts,
    ...(r.output != null ? { output: r.output } : {}),
  });
  const declared = names.map((name): RunStepSnapshot => {
    const r = byName.get(name);
    return r ? view(r) : { name, status: 'pending', attempts: 0 };
  });
  const known = new Set(names);
  return [...declared, ...rows.filter((r) => !known.has(r.step)).map(view)];
}
