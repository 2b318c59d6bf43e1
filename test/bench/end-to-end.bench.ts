import 'reflect-metadata';
import {
  type ChainStackOptions,
  openLoopWindow,
  openLoopCells,
  type OpenLoopWindow,
  PROCESSES_LEGEND,
  processesOf,
  withChain,
} from './e2e-chain';
import { orderOf } from './support';

/*
 * Issue 12, the whole chain under open-loop load: POST /v1/summaries to the
 * api, the worker (the model a local fake answering at once, through the
 * worker's model client), the relay, and the notification's arrival at a local webhook
 * receiver, each in a process of its own (e2e-chain.ts). A load generator
 * (its own process) sends at a fixed rate whatever the answers; latency is the
 * notification's arrival minus the request's scheduled send time, matched by
 * a unique `notify` that the outbox payload carries back as `to`. Every
 * notification must arrive once: a second arrival for one job is counted (and
 * must be 0).
 */

export interface EndToEndOptions extends ChainStackOptions {
  /** Default [200, 400]. */
  readonly rates?: readonly number[];
  /** Seconds of load per window; default 10. */
  readonly seconds?: number;
  /** Windows per rate, in rotated order; default 2. */
  readonly rounds?: number;
  /** How long to wait for the last notifications after the load ends; default 30 s. */
  readonly drainTimeoutMs?: number;
}

export interface EndToEndRow extends OpenLoopWindow {
  readonly round: number;
}

export async function benchEndToEnd(
  redisUrl: string,
  databaseUrl: string,
  options: EndToEndOptions = {},
): Promise<EndToEndRow[]> {
  const rates = options.rates ?? [200, 400];
  const seconds = options.seconds ?? 10;
  const rounds = options.rounds ?? 2;
  const drainTimeoutMs = options.drainTimeoutMs ?? 30_000;
  return withChain(redisUrl, databaseUrl, options, async (chain) => {
    const rows: EndToEndRow[] = [];
    // Warm-up, not reported: the JIT, the pools' connections.
    await openLoopWindow(chain, 'summaries', 100, 3, 'warmup', drainTimeoutMs);
    chain.assertAlive();
    for (let r = 0; r < rounds; r++) {
      for (const rate of orderOf(rates, r)) {
        const row = await openLoopWindow(chain, 'summaries', rate, seconds, `r${r}-${rate}`, drainTimeoutMs);
        chain.assertAlive();
        rows.push({ ...row, round: r });
      }
    }
    return rows;
  });
}

/** The tables of benchEndToEnd's rows. */
export function printEndToEnd(rows: readonly EndToEndRow[]): void {
  console.log(
    'End to end, open loop: POST /v1/summaries at a fixed rate → worker (fake model at once) → relay → webhook; latency from scheduled send to arrival',
  );
  console.table(
    rows.map((r) => ({
      'jobs/s': r.ratePerSecond,
      round: r.round,
      ...openLoopCells(r),
    })),
  );
  console.log(
    'Where the time went, from the actual send: to the stream entry (the POST up to its XADD), to the commit (the stream, ' +
      "the worker's turn, the model, the group commit), to the webhook (the relay); p50 / p99 ms each, and the mean of " +
      'each stage over the runs at or above the p99 of the whole',
  );
  console.table(
    rows.flatMap((r) =>
      r.stages
        ? [
            {
              'jobs/s': r.ratePerSecond,
              round: r.round,
              runs: r.stages.runs,
              'to XADD': `${r.stages.toQueued.p50Ms} / ${r.stages.toQueued.p99Ms}`,
              'to commit': `${r.stages.toCommitted.p50Ms} / ${r.stages.toCommitted.p99Ms}`,
              'to webhook': `${r.stages.toArrival.p50Ms} / ${r.stages.toArrival.p99Ms}`,
              'tail: XADD, commit, webhook': `${r.stages.tailMeanMs.toQueued}, ${r.stages.tailMeanMs.toCommitted}, ${r.stages.tailMeanMs.toArrival}`,
            },
          ]
        : [],
    ),
  );
  for (const r of rows)
    if (Object.keys(r.errors).length)
      console.log(`  ${r.ratePerSecond}/s round ${r.round}: POSTs without an answer: ${JSON.stringify(r.errors)}`);
  console.log(`Each process under that load: ${PROCESSES_LEGEND('job')}`);
  console.table(rows.map((r) => ({ 'jobs/s': r.ratePerSecond, round: r.round, ...processesOf(r) })));
  if (rows.some((r) => r.pauses !== undefined)) {
    console.log(
      'What held each process up during the load (BENCH_PAUSES=1): GC pauses, longest and ms per second; the longest ' +
        'event-loop delay of any quarter second, and the share of quarter seconds held over 20 ms',
    );
    console.table(
      rows.flatMap((r) =>
        Object.entries(r.pauses ?? {}).map(([process, p]) => ({
          'jobs/s': r.ratePerSecond,
          round: r.round,
          process,
          'GC max ms': p.gcMaxMs,
          'GC ms/s': p.gcMsPerSecond,
          'GCs > 10 ms': p.gcOver10Ms,
          'loop held max ms': p.loopMaxMs,
          'quarter seconds held > 20 ms': p.loopOver20MsShare,
        })),
      ),
    );
  }
}
