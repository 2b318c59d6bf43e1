import 'reflect-metadata';
import { Client } from 'pg';
import {
  type ChainStackOptions,
  type ChainWindow,
  closedLoopWindow,
  type ClosedLoopWindow,
  openLoopCells,
  openLoopWindow,
  type OpenLoopWindow,
  PROCESSES_LEGEND,
  processesOf,
  withChain,
} from './e2e-chain';
import type { ChainName } from './e2e-servers/chains';
import { median, orderOf } from './support';

/*
 * Issue 21, the triage workflow end to end: POST /v1/triage → classify and
 * draft (a model call each, the fake answering at once) → notify (an
 * email.triage_ready outbox row) → the relay → the webhook receiver, on the
 * stack the end-to-end bench runs (e2e-chain.ts: every app a process, as a pod
 * runs it). Beside it, in alternating windows on the same processes, the
 * summaries chain (one step, one model call) at the same settings, so the
 * tables show what three steps cost against one.
 *
 * - Closed loop: `clients` clients, each POSTing and waiting for its run's
 *   notification before the next: runs per second is what the chain
 *   sustains, and the CPU each app spent per run.
 * - Open loop: a fixed rate, by default half of what triage sustained in the
 *   closed loop, latency from each request's scheduled send to its
 *   notification.
 * Every accepted run's notification must arrive once: duplicates, missing and
 * strays are counted in every window, and assertDeliveredOnce fails the run
 * on any. After the windows, the runs' and steps' rows say whether a run
 * failed or a step ran more than once.
 */

export interface WorkflowsBenchOptions extends ChainStackOptions {
  /** Closed-loop clients; default 16 (the worker's concurrency). */
  readonly clients?: number;
  /**
   * Open-loop runs per second, for both chains. Default: half of what triage sustained in the closed loop (the median
   * of its rounds), rounded down to a multiple of 10: a rate this machine sustains, whatever its speed (runs on this
   * machine differ up to sixfold), so the latency measured is the chain's, not a queue's that grows all window.
   */
  readonly rate?: number;
  /** Seconds of load per window; default 10. */
  readonly seconds?: number;
  /** Windows per chain and loop, the chains' order rotated; default 2. */
  readonly rounds?: number;
  /** How long the open loop waits for the last notifications after its load ends; default 30 s. */
  readonly drainTimeoutMs?: number;
}

/** What workflow_runs and workflow_steps hold after the windows. */
export interface WorkflowRowsAfter {
  /** Triage runs by status: every one `done` once the windows are over. */
  readonly runsByStatus: Readonly<Record<string, number>>;
  /** Step rows whose step was begun more than once (a redelivery): 0 when each step ran once. */
  readonly stepsBegunTwice: number;
  readonly steps: number;
}

export interface WorkflowsBenchResults {
  readonly closed: readonly (ClosedLoopWindow & { readonly round: number })[];
  readonly open: readonly (OpenLoopWindow & { readonly round: number })[];
  readonly rows: WorkflowRowsAfter;
  /** The open loop's rate was half of triage's closed-loop runs/s (no `rate` given). */
  readonly rateDerived: boolean;
}

const CHAINS: readonly ChainName[] = ['triage', 'summaries'];

export async function benchWorkflows(
  redisUrl: string,
  databaseUrl: string,
  options: WorkflowsBenchOptions = {},
): Promise<WorkflowsBenchResults> {
  const clients = options.clients ?? 16;
  const seconds = options.seconds ?? 10;
  const rounds = options.rounds ?? 2;
  const drainTimeoutMs = options.drainTimeoutMs ?? 30_000;
  return withChain(redisUrl, databaseUrl, options, async (chain) => {
    // Warm-up, not reported: the JIT on both paths, the pools' connections.
    for (const route of CHAINS) await openLoopWindow(chain, route, 100, 3, `warmup-${route}`, drainTimeoutMs);
    chain.assertAlive();
    const closed: WorkflowsBenchResults['closed'][number][] = [];
    const open: WorkflowsBenchResults['open'][number][] = [];
    for (let r = 0; r < rounds; r++)
      for (const route of orderOf(CHAINS, r)) {
        closed.push({ ...(await closedLoopWindow(chain, route, clients, seconds, `c${r}-${route}`)), round: r });
        chain.assertAlive();
      }
    const rate =
      options.rate ??
      Math.max(
        10,
        Math.floor(median(closed.filter((w) => w.chain === 'triage').map((w) => w.runsPerSecond)) / 20) * 10,
      );
    for (let r = 0; r < rounds; r++)
      for (const route of orderOf(CHAINS, r)) {
        const row = await openLoopWindow(chain, route, rate, seconds, `o${r}-${route}`, drainTimeoutMs);
        open.push({ ...row, round: r });
        chain.assertAlive();
      }
    return { closed, open, rows: await workflowRows(databaseUrl), rateDerived: options.rate === undefined };
  });
}

async function workflowRows(databaseUrl: string): Promise<WorkflowRowsAfter> {
  const db = new Client({ connectionString: databaseUrl });
  await db.connect();
  try {
    const { rows: runs } = await db.query<{ status: string; n: number }>(
      `SELECT status, count(*)::int AS n FROM workflow_runs WHERE workflow = 'triage' GROUP BY status`,
    );
    const { rows: steps } = await db.query<{ twice: number; n: number }>(
      `SELECT count(*) FILTER (WHERE s.attempts > 1)::int AS twice, count(*)::int AS n
         FROM workflow_steps s JOIN workflow_runs r USING (run_id) WHERE r.workflow = 'triage'`,
    );
    return {
      runsByStatus: Object.fromEntries(runs.map((r) => [r.status, r.n])),
      stepsBegunTwice: steps[0].twice,
      steps: steps[0].n,
    };
  } finally {
    await db.end();
  }
}

const perApp = (w: ChainWindow) => ({
  'api µs/run': w.processes.api.cpuMicrosPerJob,
  'worker µs/run': w.processes.worker.cpuMicrosPerJob,
  'relay µs/run': w.processes.relay.cpuMicrosPerJob,
});

/** The tables of benchWorkflows' results. */
export function printWorkflows(results: WorkflowsBenchResults): void {
  console.log(
    'Workflows end to end: triage (POST /v1/triage → classify → draft → notify, two model calls) beside summaries ' +
      '(one step, one model call), the same processes, alternating windows; the fake model answers at once. ' +
      'Closed loop: each client POSTs and waits for its notification before the next; CPU per run that arrived',
  );
  console.table(
    results.closed.map((r) => ({
      chain: r.chain,
      round: r.round,
      clients: r.clients,
      'runs/s': r.runsPerSecond,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      'POST p99 ms': r.answerP99Ms,
      arrived: r.arrived,
      twice: r.duplicates,
      missing: r.missing,
      strays: r.strays,
      'model calls/run': r.modelCallsPerRun,
      ...perApp(r),
      'load avg': r.loadAverage,
    })),
  );
  console.log(
    `Open loop at ${results.open[0]?.ratePerSecond} runs/s${results.rateDerived ? " (half of triage's closed-loop runs/s)" : ''}: ` +
      'latency from the scheduled send to the notification',
  );
  console.table(results.open.map((r) => ({ chain: r.chain, round: r.round, ...openLoopCells(r), ...perApp(r) })));
  for (const r of [...results.closed, ...results.open])
    if (Object.keys(r.errors).length)
      console.log(`  ${r.chain} round ${r.round}: POSTs without an answer: ${JSON.stringify(r.errors)}`);
  console.log(`Each process, closed loop then open loop: ${PROCESSES_LEGEND('run')}`);
  console.table(
    [...results.closed, ...results.open].map((r) => ({
      chain: r.chain,
      loop: 'clients' in r ? 'closed' : 'open',
      round: r.round,
      ...processesOf(r),
    })),
  );
  console.log('Medians of the rounds (CPU per run from the closed loop), and triage over summaries');
  const medians = (chain: ChainName) => {
    const closed = results.closed.filter((r) => r.chain === chain);
    const open = results.open.filter((r) => r.chain === chain);
    const of = <T>(rows: readonly T[], f: (r: T) => number) => median(rows.map(f));
    return {
      'closed runs/s': of(closed, (r) => r.runsPerSecond),
      'closed p50 ms': of(closed, (r) => r.p50Ms),
      'open p50 ms': of(open, (r) => r.p50Ms),
      'open p99 ms': of(open, (r) => r.p99Ms),
      'api µs/run': of(closed, (r) => r.processes.api.cpuMicrosPerJob),
      'worker µs/run': of(closed, (r) => r.processes.worker.cpuMicrosPerJob),
      'relay µs/run': of(closed, (r) => r.processes.relay.cpuMicrosPerJob),
    };
  };
  const triage = medians('triage');
  const summaries = medians('summaries');
  const ratio = Object.fromEntries(
    Object.entries(triage).map(([k, v]) => [k, +(v / summaries[k as keyof typeof summaries]).toFixed(2)]),
  );
  console.table([
    { chain: 'triage', ...triage },
    { chain: 'summaries', ...summaries },
    { chain: 'triage / summaries', ...ratio },
  ]);
  const { runsByStatus, stepsBegunTwice, steps } = results.rows;
  console.log(
    `Triage runs by status: ${JSON.stringify(runsByStatus)}; steps begun more than once: ${stepsBegunTwice} of ${steps}`,
  );
}

/**
 * What went wrong with the deliveries, one line each: an accepted run not notified or notified twice, a stray
 * notification, a POST not accepted, a triage run not done. Empty when every run was notified exactly once.
 */
export function deliveryProblems(results: WorkflowsBenchResults): string[] {
  const wrong = [...results.closed, ...results.open].filter(
    (r) =>
      r.duplicates > 0 ||
      r.missing > 0 ||
      r.strays > 0 ||
      Object.entries(r.statuses).some(([status, n]) => status !== '202' && n > 0),
  );
  return [
    ...wrong.map(
      (r) =>
        `workflows: ${r.chain} round ${r.round} (${'clients' in r ? 'closed' : 'open'} loop): ${r.duplicates} twice, ` +
        `${r.missing} missing (not arrived when the window gave up waiting), ${r.strays} strays, answers ` +
        JSON.stringify(r.statuses),
    ),
    ...Object.entries(results.rows.runsByStatus)
      .filter(([status, n]) => status !== 'done' && n > 0)
      .map(([status, n]) => `workflows: ${n} triage runs ${status} after the windows`),
  ];
}
