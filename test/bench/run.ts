/*
 * npm run bench: the benchmarks, never part of npm test. Runs against the
 * Redis and PostgreSQL of TEST_REDIS_URL / TEST_DATABASE_URL (else
 * REDIS_URL / DATABASE_URL), in Redis databases 13 to 15 (TEST_SLOT=4's:
 * never beside a test run in that slot) and databases of their own
 * (llmwf_bench*, migrated here), so a developer's data is not touched. Every figure is printed, and
 * written, with the date, the machine and its load, to bench-results/<start time>.md (ignored by git:
 * raw output is not committed; docs/benchmarks.md holds what a run showed); BENCH_RESULTS=<file>
 * writes it elsewhere.
 */
import 'reflect-metadata';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { cpus, loadavg, totalmem } from 'node:os';
import { format } from 'node:util';
import { benchApiProfile, benchApiSideBySide, printApiProfile, printApiSideBySide } from './api-side-by-side.bench';
import { benchCluster, printCluster } from './cluster.bench';
import { benchEndToEnd, printEndToEnd } from './end-to-end.bench';
import {
  benchGatewayProfile,
  benchGatewaySideBySide,
  printGatewayProfile,
  printGatewaySideBySide,
} from './gateway-side-by-side.bench';
import { benchGateway, type GatewayBenchResults } from './gateway.bench';
import { benchHostileInput } from './hostile-input.bench';
import { benchIdempotencyStores } from './idempotency-stores.bench';
import { benchRefunds } from './refunds.bench';
import { BASE_DATABASE_URL, BASE_REDIS_URL } from '../support/infra';
import { benchDatabaseNamed } from './support';
import { benchWorkerSideBySide, printWorkerSideBySide } from './worker-side-by-side.bench';
import { benchWorkflows, deliveryProblems, printWorkflows } from './workflows.bench';

// The tests' servers (TEST_REDIS_URL / TEST_DATABASE_URL, else REDIS_URL / DATABASE_URL).
const redisBase = BASE_REDIS_URL;
const databaseUrl = BASE_DATABASE_URL;

/**
 * BENCH=api,worker runs only those parts; unset, all:
 * api (side by side with a bare Nest endpoint, that endpoint with @node-idempotency/nestjs, and our
 * stack without idempotency), api-profile (where each of those sides' CPU per request goes, from a V8
 * profile of a load window), worker (side by side
 * with BullMQ), e2e (the chain, open loop), workflows (the triage workflow end
 * to end beside the summaries chain, closed and open loop), stores, refunds,
 * hostile, gateway (in one process, against the provider called directly),
 * gateway-peers (each in its own process: the provider directly, Portkey,
 * ours, the floor), gateway-profile (where ours and the floor spend a call's CPU), cluster (one Redis
 * against a local Redis Cluster).
 */
const PARTS = [
  'api',
  'api-profile',
  'worker',
  'e2e',
  'workflows',
  'stores',
  'refunds',
  'hostile',
  'gateway',
  'gateway-peers',
  'gateway-profile',
  'cluster',
] as const;
const chosen = (process.env.BENCH ?? '')
  .split(',')
  .map((p) => p.trim())
  .filter(Boolean);
for (const part of chosen)
  if (!(PARTS as readonly string[]).includes(part)) throw new Error(`BENCH: no part "${part}" (${PARTS.join(', ')})`);
const want = (part: (typeof PARTS)[number]): boolean => chosen.length === 0 || chosen.includes(part);

/** When this run started: what its results file is named by. */
const runStartedAt = new Date();
// The servers are child processes (processes.ts kills them on exit): an interrupted bench writes what it printed,
// exits, and takes them along.
for (const signal of ['SIGINT', 'SIGTERM'] as const)
  process.once(signal, () => {
    writeResults(runStartedAt, load());
    process.exit(130);
  });

/** Everything printed, for the results file: console.table prints through console.log. */
const printed: string[] = [];
const log = console.log.bind(console);
console.log = (...args: unknown[]) => {
  printed.push(format(...args));
  log(...args);
};

const load = (): string =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');

async function main(): Promise<void> {
  /** A guarantee a part saw broken (a notification missing or sent twice): printed, written, then the run fails. */
  const failures: string[] = [];
  const startedAt = runStartedAt;
  const loadAtStart = load();
  console.log(
    `node ${process.version}, ${cpus().length} cpus (${cpus()[0]?.model ?? 'unknown'}), ` +
      `${Math.round(totalmem() / 2 ** 30)} GiB, load ${loadAtStart}`,
  );
  try {
    const benchDb = await benchDatabaseNamed(databaseUrl, 'llmwf_bench');
    if (want('api')) printApiSideBySide(await benchApiSideBySide(`${redisBase}/14`, benchDb));
    if (want('api-profile')) printApiProfile(await benchApiProfile(`${redisBase}/14`, benchDb));
    if (want('worker') || want('e2e') || want('workflows') || want('cluster')) {
      const workerDb = await benchDatabaseNamed(databaseUrl, 'llmwf_bench_worker');
      if (want('worker')) printWorkerSideBySide(await benchWorkerSideBySide(`${redisBase}/13`, workerDb));
      if (want('e2e')) printEndToEnd(await benchEndToEnd(`${redisBase}/13`, workerDb));
      if (want('workflows')) {
        const workflows = await benchWorkflows(`${redisBase}/13`, workerDb);
        printWorkflows(workflows);
        failures.push(...deliveryProblems(workflows));
      }
      if (want('cluster')) printCluster(await benchCluster(`${redisBase}/13`, workerDb));
    }
    if (want('stores')) await printStores(benchDb);
    if (want('refunds')) await printRefunds(benchDb);
    if (want('hostile')) await printHostile(benchDb);
    if (want('gateway')) printGateway(await benchGateway(`${redisBase}/15`, benchDb));
    if (want('gateway-peers')) printGatewaySideBySide(await benchGatewaySideBySide(`${redisBase}/15`, benchDb));
    if (want('gateway-profile')) printGatewayProfile(await benchGatewayProfile(`${redisBase}/15`, benchDb));
    for (const failure of failures) console.log(`FAILED: ${failure}`);
  } finally {
    // What was printed so far, a part that failed or an interrupted run included.
    writeResults(startedAt, loadAtStart);
  }
  if (failures.length) throw new Error(failures.join('\n'));
}

/** Everything printed, with the date, the machine's load and the parts, to bench-results/ (or BENCH_RESULTS). */
function writeResults(startedAt: Date, loadAtStart: string): void {
  const file = process.env.BENCH_RESULTS ?? `bench-results/${startedAt.toISOString().replace(/[:.]/g, '-')}.md`;
  mkdirSync(dirname(resolve(file)), { recursive: true });
  const header = [
    '# Benchmark results',
    '',
    `\`npm run bench\`${chosen.length ? ` (BENCH=${chosen.join(',')})` : ''}, ${startedAt.toISOString()} to ` +
      `${new Date().toISOString()}; load average ${loadAtStart} at the start, ${load()} at the end. ` +
      'Written by test/bench/run.ts; docs/benchmarks.md says what each table measures.',
    '',
  ];
  writeFileSync(file, [...header, '```', ...printed, '```', ''].join('\n'));
  log(`written to ${file}`);
}

async function printStores(benchDb: string): Promise<void> {
  console.log(
    'POST /v1/summaries by idempotency store (IDEMPOTENCY_STORE): medians of alternating rounds, round trips over all of them',
  );
  console.table(
    (await benchIdempotencyStores(`${redisBase}/15`, benchDb)).map((r) => ({
      store: r.store,
      request: r.phase,
      'rounds x requests': `${r.rounds} x ${r.requestsPerRound}`,
      concurrency: r.concurrency,
      'req/s': r.perSecond,
      'req/s min-max': `${r.perSecondMin}-${r.perSecondMax}`,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      'Redis round trips/req': r.redisRoundTripsPerRequest,
      'PostgreSQL round trips/req': r.postgresRoundTripsPerRequest,
    })),
  );
}

async function printRefunds(benchDb: string): Promise<void> {
  console.log(
    'POST /v1/refunds (built-in provider) against the same work without idempotency: medians of alternating rounds, added and / plain the medians of each round against plain, round trips over all of them',
  );
  console.table(
    (await benchRefunds(`${redisBase}/15`, benchDb)).map((r) => ({
      benchmark: r.side,
      route: r.path,
      'rounds x requests': `${r.rounds} x ${r.requestsPerRound}`,
      concurrency: r.concurrency,
      'req/s': r.perSecond,
      'req/s min-max': `${r.perSecondMin}-${r.perSecondMax}`,
      'p50 ms': r.p50Ms,
      'p50 min-max': `${r.p50MinMs}-${r.p50MaxMs}`,
      'p99 ms': r.p99Ms,
      'added p50 ms': r.addedP50Ms ?? '',
      'added p99 ms': r.addedP99Ms ?? '',
      'p50 / plain': r.p50OverPlain ?? '',
      'req/s / plain': r.perSecondOverPlain ?? '',
      'Redis round trips/req': r.redisRoundTripsPerRequest,
      'PostgreSQL round trips/req': r.postgresRoundTripsPerRequest,
    })),
  );
}

async function printHostile(benchDb: string): Promise<void> {
  console.log('Hostile bodies, one at a time: latency and the longest event-loop block while they ran');
  console.table(
    (await benchHostileInput(`${redisBase}/15`, benchDb)).map((r) => ({
      app: r.app,
      body: r.shape,
      bytes: r.bytes,
      status: r.status,
      'answer bytes': r.answerBytes,
      'p50 ms': r.medianMs,
      'max ms': r.maxMs,
      'loop blocked max ms': r.loopMaxMs,
    })),
  );
}

function printGateway(results: GatewayBenchResults): void {
  console.log(
    'POST /v1/chat/completions against calling the provider directly: one request at a time, medians of 5 alternating rounds',
  );
  console.table(
    results.calls.map((r) => ({
      benchmark: r.side,
      requests: r.requests,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      'added p50 ms': r.addedP50Ms ?? '',
      'added p99 ms': r.addedP99Ms ?? '',
      'Redis round trips/req': r.redisRoundTripsPerRequest,
    })),
  );
  console.table(
    results.streams.map((r) => ({
      benchmark: r.side,
      streams: r.streams,
      'TTFT p50 ms': r.ttftP50Ms,
      'TTFT p99 ms': r.ttftP99Ms,
      'added TTFT p50 ms': r.addedTtftP50Ms ?? '',
      'added TTFT p99 ms': r.addedTtftP99Ms ?? '',
      'last byte p50 ms': r.lastByteP50Ms,
      'last byte p99 ms': r.lastByteP99Ms,
      'replay/original': r.replayOverOriginal ?? '',
      'Redis round trips/req': r.redisRoundTripsPerRequest,
    })),
  );
  console.table(
    results.throughput.map((r) => ({
      benchmark: r.side,
      requests: r.requests,
      concurrency: r.concurrency,
      'req/s': r.perSecond,
      'p50 ms': r.p50Ms,
    })),
  );
  console.log(
    'A large stream sent to slow readers (1 MiB/s each): what the api retains after a full GC, against gathering each whole',
  );
  console.table(
    results.memory.map((r) => ({
      phase: r.phase,
      readers: r.readers,
      'stream MB': r.streamMb,
      'all gathered whole MB': r.gatheredMb,
      'retained peak MB': r.retainedPeakMb,
      'RSS growth MB': r.rssGrowthMb,
      'reader s (p50)': r.readerSeconds,
      'upstream calls': r.upstreamCalls,
    })),
  );
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
