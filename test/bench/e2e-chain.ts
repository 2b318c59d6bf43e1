import { Redis } from 'ioredis';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { Client } from 'pg';
import type { ChainName } from './e2e-servers/chains';
import { harnessScript } from './servers/build';
import type { ClosedLoopReport } from './e2e-servers/closed-loop.load';
import type { LoadReport } from './e2e-servers/open-loop.load';
import type { Arrival } from './e2e-servers/webhook-receiver.server';
import { imageNodeOptions, kubernetesMemoryLimitMiB, type MemoryCgroup } from './memory-limit';
import {
  freePort,
  meter,
  type Meter,
  type MeterReading,
  REPO_ROOT,
  spawnServer,
  type SpawnedServer,
} from './processes';
import { KEY, percentile } from './support';
import { ourApps, type OurApps, startFakeModel } from './worker-side-by-side.bench';

/*
 * The whole chain as production runs it, for the end-to-end benches
 * (end-to-end.bench.ts: summaries; workflows.bench.ts: triage beside
 * summaries): the api, worker and relay (their real main.ts, built), the fake
 * model (answering at once, through the openai SDK) and the webhook receiver,
 * each a process of its own; the api, worker and relay each in a memory
 * cgroup of its Kubernetes limit with the image's NODE_OPTIONS, as a pod runs
 * them. One stack serves every chain (chains.ts): the api takes each route,
 * the worker consumes every queue, the relay sends every topic.
 *
 * A window drives one chain with a load generator in a process of its own,
 * metered from its first send (ts-node's start-up is not in it), and counts
 * what reached the receiver: every accepted run's notification must arrive
 * once (`missing` and `duplicates` are 0), and none that no request of the
 * window asked for (`strays`). Open loop (open-loop.load.ts): a fixed rate
 * whatever the answers, latency from each request's scheduled send. Closed
 * loop (closed-loop.load.ts): N clients, each waiting for its run's
 * notification before the next, so runs per second is what the chain
 * sustains.
 */

export interface ChainStackOptions {
  /** LOG_LEVEL of the api, worker and relay; default info, as production runs. */
  readonly logLevel?: string;
  /** How the api, worker and relay run; default ourApps('js'). */
  readonly apps?: OurApps;
  /**
   * Runs the api, worker and relay as pods run them: each in a memory cgroup of its Kubernetes limit
   * (memory-limit.ts), with the image's NODE_OPTIONS; default true.
   */
  readonly memoryLimits?: boolean;
}

export type ChainProcess = 'api' | 'worker' | 'relay' | 'model' | 'receiver';
type App = 'api' | 'worker' | 'relay';

export interface RunningChain {
  readonly apiOrigin: string;
  readonly receiverUrl: string;
  readonly pids: Readonly<Record<ChainProcess, number>>;
  readonly cgroups: Readonly<Record<App, MemoryCgroup | undefined>>;
  /** Throws with the stderr of every process of the stack that has died. */
  assertAlive(): void;
  /** Chat completions the fake model has answered so far. */
  modelCalls(): Promise<number>;
  /** When each run of a notify address reached its stages (ms since the epoch), the runs whose outbox row exists. */
  stagesOf(tos: readonly string[]): Promise<Map<string, StageTimes>>;
  /** With BENCH_PAUSES=1: where every process of the chain records what held it up (profile/pauses.preload.js). */
  readonly pausesDir?: string;
}

/** What held one process up during a window: its GC pauses and its event loop's longest delays. */
export interface ProcessPauses {
  readonly gcMaxMs: number;
  /** GC pauses summed over the window, ms per second of it. */
  readonly gcMsPerSecond: number;
  readonly gcOver10Ms: number;
  /** The longest event-loop delay of any quarter second, and the share of quarter seconds held over 20 ms. */
  readonly loopMaxMs: number;
  readonly loopOver20MsShare: number;
}

/**
 * Where a run's time went, from what the system records anyway: the run
 * record's accepted_at (when the api's start script ran: the XADD), the
 * outbox row's created_at (its commit's transaction, on PostgreSQL's clock),
 * and the webhook's arrival. One machine, one clock.
 */
export interface StageTimes {
  readonly queuedAt: number;
  readonly committedAt: number;
}

export interface ProcessUnderLoad {
  readonly cpuMicrosPerJob: number;
  /** CPU over the window's wall time: 1 is one core busy. */
  readonly cores: number;
  readonly peakRssMb: number;
  /** The app's memory limit (its Kubernetes manifest's), when it runs in a cgroup of it. */
  readonly limitMiB?: number;
  /** The cgroup's peak usage so far (RSS and page cache) and its OOM kills, when limited. */
  readonly cgroupPeakMiB?: number;
  readonly oomKills?: number;
}

/** What every window reports: the runs' notifications as the receiver saw them, and what each process spent. */
export interface ChainWindow {
  readonly chain: ChainName;
  readonly seconds: number;
  readonly sent: number;
  /** Answers by status. */
  readonly statuses: Readonly<Record<string, number>>;
  /** Failed POSTs by error (no answer). */
  readonly errors: Readonly<Record<string, number>>;
  /** Runs whose notification arrived (once or more). */
  readonly arrived: number;
  /** Runs whose notification arrived more than once (must be 0). */
  readonly duplicates: number;
  /** Accepted runs whose notification never arrived (must be 0). */
  readonly missing: number;
  /** Notifications that did not match a request of this window. */
  readonly strays: number;
  /** Model calls per run that arrived (the fake model's count over the window). */
  readonly modelCallsPerRun: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** The POST's own answer. */
  readonly answerP50Ms: number;
  readonly answerP99Ms: number;
  /** The machine's 1-minute load average at the window's end (2 cores; other engineers' runs show up here). */
  readonly loadAverage: number;
  /** CPU and memory per process; `cpuMicrosPerJob` is over the runs that arrived. */
  readonly processes: Readonly<Record<ChainProcess, ProcessUnderLoad>>;
}

export interface OpenLoopWindow extends ChainWindow {
  readonly ratePerSecond: number;
  readonly maxMs: number;
  /**
   * p99 from the moment the sender actually sent each request: the system's own tail, without the sender's lag
   * (p99Ms, from the schedule, is what a user of an open system sees).
   */
  readonly p99FromSendMs: number;
  /** p50 of the first and of the last tenth of the requests by send time (a backlog that grows shows here). */
  readonly firstTenthP50Ms: number;
  readonly lastTenthP50Ms: number;
  /** The most the generator's sends lagged their schedule. */
  readonly senderLagMaxMs: number;
  /** Where the time went, stage by stage (summaries only: a run of its one step). */
  readonly stages?: StageBreakdown;
  /** With BENCH_PAUSES=1: what held each process up during the load, by process name. */
  readonly pauses?: Readonly<Record<string, ProcessPauses>>;
}

/**
 * p50 and p99 of each stage from the actual send: to the stream entry (the
 * POST up to its XADD), to the commit (waiting in the stream, the worker's
 * turn, the model, the group commit), to the webhook's arrival (the relay's
 * wake-up and delivery); and, for the runs whose whole time is at or above
 * the p99, the mean of each stage: where the tail goes.
 */
export interface StageBreakdown {
  readonly runs: number;
  readonly toQueued: { readonly p50Ms: number; readonly p99Ms: number };
  readonly toCommitted: { readonly p50Ms: number; readonly p99Ms: number };
  readonly toArrival: { readonly p50Ms: number; readonly p99Ms: number };
  readonly tailMeanMs: { readonly toQueued: number; readonly toCommitted: number; readonly toArrival: number };
}

async function stageBreakdown(
  chain: RunningChain,
  first: ReadonlyMap<string, number>,
  sentAt: Readonly<Record<string, number>>,
): Promise<StageBreakdown | undefined> {
  const times = await chain.stagesOf([...first.keys()]);
  const runs = [...times].flatMap(([to, t]) => {
    const sent = sentAt[to];
    const arrived = first.get(to);
    if (sent === undefined || arrived === undefined) return [];
    return [
      {
        toQueued: t.queuedAt - sent,
        toCommitted: t.committedAt - t.queuedAt,
        toArrival: arrived - t.committedAt,
        total: arrived - sent,
      },
    ];
  });
  if (runs.length === 0) return undefined;
  const p = (xs: number[], q: number) =>
    ms(
      percentile(
        [...xs].sort((a, b) => a - b),
        q,
      ),
    );
  const of = (k: 'toQueued' | 'toCommitted' | 'toArrival') => ({
    p50Ms: p(
      runs.map((r) => r[k]),
      0.5,
    ),
    p99Ms: p(
      runs.map((r) => r[k]),
      0.99,
    ),
  });
  const cut =
    percentile(
      runs.map((r) => r.total).sort((a, b) => a - b),
      0.99,
    ) ?? Infinity;
  const tail = runs.filter((r) => r.total >= cut);
  const mean = (k: 'toQueued' | 'toCommitted' | 'toArrival') => ms(tail.reduce((n, r) => n + r[k], 0) / tail.length);
  return {
    runs: runs.length,
    toQueued: of('toQueued'),
    toCommitted: of('toCommitted'),
    toArrival: of('toArrival'),
    tailMeanMs: { toQueued: mean('toQueued'), toCommitted: mean('toCommitted'), toArrival: mean('toArrival') },
  };
}

export interface ClosedLoopWindow extends ChainWindow {
  readonly clients: number;
  /** Runs whose notification arrived, over the first send to the last arrival. */
  readonly runsPerSecond: number;
}

const mb = (bytes: number): number => +(bytes / 2 ** 20).toFixed(1);
/** Rounded to 0.1 ms; a percentile of no values (nothing arrived) is NaN. */
const ms = (x: number | undefined): number => +(x ?? NaN).toFixed(1);

/**
 * Starts the stack on a flushed Redis database and emptied tables, runs `use`
 * with it, and stops it; a process of the stack that died is named in the
 * error, with its stderr.
 */
export async function withChain<T>(
  redisUrl: string,
  databaseUrl: string,
  options: ChainStackOptions,
  use: (chain: RunningChain) => Promise<T>,
): Promise<T> {
  const logLevel = options.logLevel ?? 'info';
  const apps = options.apps ?? ourApps('js');
  // As a pod runs them: in a cgroup of the manifest's limit, with the image's NODE_OPTIONS.
  const limit = (app: App): { memoryLimitMiB?: number } =>
    options.memoryLimits === false ? {} : { memoryLimitMiB: kubernetesMemoryLimitMiB(app) };
  // BENCH_PAUSES=1: every process of the chain (the bench's helpers too, through this process's environment)
  // records its GC pauses and event-loop delays for the windows to read.
  const pausesDir = process.env.BENCH_PAUSES === '1' ? mkdtempSync(join(tmpdir(), 'llmwf-pauses-')) : undefined;
  const watch = pausesDir === undefined ? '' : ` --require ${resolve(__dirname, 'profile/pauses.preload.js')}`;
  if (pausesDir !== undefined) {
    process.env.BENCH_PAUSES_DIR = pausesDir;
    process.env.NODE_OPTIONS = `${process.env.NODE_OPTIONS ?? ''}${watch}`.trim();
  }
  const nodeOptions: Record<string, string> =
    options.memoryLimits === false ? {} : { NODE_OPTIONS: `${imageNodeOptions()}${watch}` };
  const redis = new Redis(redisUrl);
  await redis.flushdb();
  redis.disconnect();
  {
    const db = new Client({ connectionString: databaseUrl });
    await db.connect();
    await db.query('TRUNCATE summaries, outbox, workflow_runs, workflow_steps');
    await db.end();
  }
  const started: SpawnedServer[] = [];
  const start = async (server: Promise<SpawnedServer>): Promise<SpawnedServer> => {
    const s = await server;
    started.push(s);
    return s;
  };
  const died: string[] = [];
  let stopping = false;
  try {
    const model = await start(startFakeModel(0));
    const receiver = await start(
      spawnServer({
        name: 'webhook receiver',
        script: harnessScript('webhook-receiver.server.ts'),
        ready: /listening on (http:\/\/\S+)/,
        stdout: 'ignore',
      }),
    );
    const common = { REDIS_URL: redisUrl, DATABASE_URL: databaseUrl, LOG_LEVEL: logLevel, ...nodeOptions };
    const spawnApp = async (app: App, env: Record<string, string>, portVariable: string): Promise<SpawnedServer> => {
      const port = await freePort();
      const how = apps.spawnOf(app);
      return start(
        spawnServer({
          name: app,
          ...how,
          ...limit(app),
          env: { ...how.env, ...common, ...env, [portVariable]: String(port), BENCH_PAUSES_NAME: app },
          ready: { url: `http://127.0.0.1:${port}/health/live` },
        }),
      );
    };
    const api = await spawnApp('api', { API_KEYS: `bench:${KEY}`, LLM_PROVIDER: 'fake' }, 'PORT');
    const worker = await spawnApp(
      'worker',
      {
        WORKER_CONCURRENCY: '16',
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'bench',
        OPENAI_BASE_URL: `${model.url}/v1`,
      },
      'HEALTH_PORT',
    );
    const relay = await spawnApp('relay', { NOTIFY_WEBHOOK_URL: `${receiver.url}/notify` }, 'HEALTH_PORT');
    for (const s of [model, receiver, api, worker, relay])
      s.child.once('exit', (code, signal) => {
        if (!stopping) died.push(`${s.name} exited (code ${code}, signal ${signal}):\n${s.stderr().slice(-3000)}`);
      });
    return await use({
      apiOrigin: api.url!,
      receiverUrl: receiver.url!,
      pids: { api: api.pid, worker: worker.pid, relay: relay.pid, model: model.pid, receiver: receiver.pid },
      cgroups: { api: api.memory, worker: worker.memory, relay: relay.memory },
      assertAlive() {
        if (died.length) throw new Error(died.join('\n'));
      },
      async modelCalls() {
        const res = await fetch(`${model.url}/count`);
        return ((await res.json()) as { answered: number }).answered;
      },
      stagesOf: (tos) => stagesOf(redisUrl, databaseUrl, tos),
      ...(pausesDir === undefined ? {} : { pausesDir }),
    });
  } catch (err) {
    if (died.length) throw new Error(died.join('\n'), { cause: err });
    throw err;
  } finally {
    stopping = true;
    for (const s of started.reverse()) await s.stop();
    if (pausesDir !== undefined) {
      delete process.env.BENCH_PAUSES_DIR;
      process.env.NODE_OPTIONS = (process.env.NODE_OPTIONS ?? '').replace(watch, '').trim();
      rmSync(pausesDir, { recursive: true, force: true });
    }
  }
}

/** Each process's pauses between `from` and `to` (ms since the epoch), from the records in `dir`. */
function pausesBetween(dir: string, from: number, to: number): Record<string, ProcessPauses> {
  const out: Record<string, ProcessPauses> = {};
  const seconds = Math.max(0.001, (to - from) / 1000);
  for (const file of readdirSync(dir)) {
    const lines = readFileSync(join(dir, file), 'utf8').split('\n').filter(Boolean);
    const { name } = JSON.parse(lines[0]) as { name: string };
    const gc: number[] = [];
    const loop: number[] = [];
    for (const text of lines.slice(1)) {
      let tick: { t: number; loop: number; gc: [number, number][] };
      try {
        tick = JSON.parse(text) as typeof tick;
      } catch {
        continue; // the last line, caught mid-append
      }
      if (tick.t < from || tick.t > to) continue;
      loop.push(tick.loop);
      for (const [at, duration] of tick.gc) if (at >= from && at <= to) gc.push(duration);
    }
    if (loop.length === 0) continue; // not running in this window (a sender of another window)
    loop.sort((a, b) => a - b);
    out[name] = {
      gcMaxMs: ms(Math.max(0, ...gc)),
      gcMsPerSecond: ms(gc.reduce((a, b) => a + b, 0) / seconds),
      gcOver10Ms: gc.filter((d) => d > 10).length,
      loopMaxMs: ms(loop[loop.length - 1]),
      loopOver20MsShare: +(loop.filter((d) => d > 20).length / loop.length).toFixed(2),
    };
  }
  return out;
}

async function stagesOf(
  redisUrl: string,
  databaseUrl: string,
  tos: readonly string[],
): Promise<Map<string, StageTimes>> {
  const db = new Client({ connectionString: databaseUrl });
  await db.connect();
  const redis = new Redis(redisUrl);
  try {
    const { rows } = await db.query<{ to: string; job_id: string; committed: string }>(
      `SELECT payload->>'to' AS to, payload->>'job_id' AS job_id, extract(epoch FROM created_at) * 1000 AS committed
         FROM outbox WHERE payload->>'to' = ANY($1)`,
      [tos],
    );
    // The run record's accepted_at: the api's clock when its start script ran (the stream entries are gone once acked).
    const accepted = await Promise.all(rows.map((row) => redis.hget(`{summaries}:job:${row.job_id}`, 'accepted_at')));
    const queuedAt = new Map(
      rows.flatMap((row, i) => (accepted[i] ? [[row.job_id, Number(accepted[i])] as const] : [])),
    );
    const stages = new Map<string, StageTimes>();
    for (const row of rows) {
      const queued = queuedAt.get(row.job_id);
      if (queued !== undefined) stages.set(row.to, { queuedAt: queued, committedAt: Number(row.committed) });
    }
    return stages;
  } finally {
    redis.disconnect();
    await db.end();
  }
}

/**
 * POSTs `route` at `rate` a second for `seconds` whatever the answers, then
 * waits up to `drainTimeoutMs` for every accepted run's notification (and
 * half a second more for a late duplicate).
 */
export async function openLoopWindow(
  chain: RunningChain,
  route: ChainName,
  rate: number,
  seconds: number,
  tag: string,
  drainTimeoutMs: number,
): Promise<OpenLoopWindow> {
  const before = await begin(chain);
  const loadFrom = Date.now();
  const { report: load, meters } = await runLoad<LoadReport>(chain, 'open-loop.load.ts', [
    chain.apiOrigin,
    KEY,
    route,
    String(rate),
    String(seconds),
    tag,
  ]);
  const accepted = load.statuses['202'] ?? 0;
  const arrivals: Arrival[] = [];
  const deadline = performance.now() + drainTimeoutMs;
  const seen = new Set<string>();
  for (;;) {
    for (const a of await takeArrivals(chain)) {
      arrivals.push(a);
      if (a.to in load.scheduled) seen.add(a.to);
    }
    if (seen.size >= accepted || performance.now() > deadline) break;
    await delay(100);
  }
  const loadTo = Date.now();
  await delay(500); // a late duplicate would arrive now
  arrivals.push(...(await takeArrivals(chain)));
  const readings = stopMeters(meters);

  const { first, ...counts } = tally(arrivals, load.scheduled);
  const bySchedule = [...first].map(([to, at]) => [load.scheduled[to], at - load.scheduled[to]] as const);
  bySchedule.sort((a, b) => a[0] - b[0]);
  const latencies = bySchedule.map(([, l]) => l).sort((a, b) => a - b);
  const fromSend = [...first].map(([to, at]) => at - (load.sentAt[to] ?? load.scheduled[to])).sort((a, b) => a - b);
  // The first and last tenth of the window, by send time: a queue that builds up shows as last >> first.
  const tenth = (from: number) =>
    percentile(
      bySchedule
        .slice(Math.floor(bySchedule.length * from), Math.floor(bySchedule.length * (from + 0.1)))
        .map(([, l]) => l)
        .sort((a, b) => a - b),
      0.5,
    );
  return {
    chain: route,
    ratePerSecond: rate,
    seconds,
    stages: await stageBreakdown(chain, first, load.sentAt),
    sent: load.sent,
    statuses: load.statuses,
    errors: load.errors,
    ...counts,
    missing: accepted - first.size,
    modelCallsPerRun: await modelCallsPerRun(chain, before, first.size),
    p50Ms: ms(percentile(latencies, 0.5)),
    p99Ms: ms(percentile(latencies, 0.99)),
    p99FromSendMs: ms(percentile(fromSend, 0.99)),
    maxMs: ms(latencies[latencies.length - 1] ?? NaN),
    firstTenthP50Ms: ms(tenth(0) ?? NaN),
    lastTenthP50Ms: ms(tenth(0.9) ?? NaN),
    answerP50Ms: ms(load.answerP50Ms),
    answerP99Ms: ms(load.answerP99Ms),
    senderLagMaxMs: ms(load.lagMaxMs),
    loadAverage: +loadavg()[0].toFixed(1),
    processes: underLoad(readings, chain.cgroups, first.size),
    ...(chain.pausesDir === undefined ? {} : { pauses: pausesBetween(chain.pausesDir, loadFrom, loadTo) }),
  };
}

/**
 * `clients` clients POST `route` for `seconds`, each waiting for its run's
 * notification before the next; metered from the first send to the last
 * arrival (the generator's exit), then half a second more for a late
 * duplicate.
 */
export async function closedLoopWindow(
  chain: RunningChain,
  route: ChainName,
  clients: number,
  seconds: number,
  tag: string,
): Promise<ClosedLoopWindow> {
  const before = await begin(chain);
  const { report: load, meters } = await runLoad<ClosedLoopReport>(chain, 'closed-loop.load.ts', [
    chain.apiOrigin,
    KEY,
    route,
    String(clients),
    String(seconds),
    tag,
    chain.receiverUrl,
  ]);
  const readings = stopMeters(meters);
  await delay(500); // a late duplicate would arrive now
  const { first, ...counts } = tally(await takeArrivals(chain), load.sentAt);
  const latencies = [...first].map(([to, at]) => at - load.sentAt[to]).sort((a, b) => a - b);
  return {
    chain: route,
    clients,
    seconds,
    sent: load.sent,
    statuses: load.statuses,
    errors: load.errors,
    ...counts,
    missing: (load.statuses['202'] ?? 0) - first.size,
    modelCallsPerRun: await modelCallsPerRun(chain, before, first.size),
    runsPerSecond: Math.round(load.completed / ((load.lastArrivalAt - load.firstSendAt) / 1000)),
    p50Ms: ms(percentile(latencies, 0.5)),
    p99Ms: ms(percentile(latencies, 0.99)),
    answerP50Ms: ms(load.answerP50Ms),
    answerP99Ms: ms(load.answerP99Ms),
    loadAverage: +loadavg()[0].toFixed(1),
    processes: underLoad(readings, chain.cgroups, first.size),
  };
}

/** Before a window: nothing left over at the receiver; the model's count to start from. */
async function begin(chain: RunningChain): Promise<number> {
  await takeArrivals(chain);
  return chain.modelCalls();
}

async function modelCallsPerRun(chain: RunningChain, before: number, runs: number): Promise<number> {
  return +(((await chain.modelCalls()) - before) / Math.max(1, runs)).toFixed(2);
}

/**
 * Runs a load generator (e2e-servers/<script>) to its end, in a process of its
 * own; the chain's processes are metered from its `sending` line on stderr.
 */
async function runLoad<R>(
  chain: RunningChain,
  script: string,
  args: readonly string[],
): Promise<{ report: R; meters: Record<ChainProcess, Meter> }> {
  let meters = {} as Record<ChainProcess, Meter>;
  const stdout = await new Promise<string>((done, fail) => {
    const child = spawn(process.execPath, [harnessScript(script), ...args], {
      cwd: REPO_ROOT,
      env: process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      err += d;
      if (d.includes('sending'))
        meters = Object.fromEntries(Object.entries(chain.pids).map(([name, pid]) => [name, meter(pid)])) as Record<
          ChainProcess,
          Meter
        >;
    });
    child.once('exit', (code) =>
      code === 0 ? done(Buffer.concat(out).toString('utf8')) : fail(new Error(`${script}: ${code}\n${err}`)),
    );
  });
  return { report: JSON.parse(stdout) as R, meters };
}

function stopMeters(meters: Record<ChainProcess, Meter>): Record<ChainProcess, MeterReading> {
  return Object.fromEntries(Object.entries(meters).map(([name, m]) => [name, m.stop()])) as Record<
    ChainProcess,
    MeterReading
  >;
}

/** The first arrival of each run of the window (by its notify address), and what arrived besides. */
function tally(
  arrivals: readonly Arrival[],
  window: Readonly<Record<string, number>>,
): { first: Map<string, number>; arrived: number; duplicates: number; strays: number } {
  const first = new Map<string, number>();
  let duplicates = 0;
  let strays = 0;
  for (const a of arrivals) {
    if (!(a.to in window)) strays++;
    else if (first.has(a.to)) duplicates++;
    else first.set(a.to, a.at);
  }
  return { first, arrived: first.size, duplicates, strays };
}

function underLoad(
  readings: Record<ChainProcess, MeterReading>,
  cgroups: RunningChain['cgroups'],
  runs: number,
): ChainWindow['processes'] {
  const jobs = Math.max(1, runs);
  return Object.fromEntries(
    Object.entries(readings).map(([name, r]) => {
      const cgroup = cgroups[name as App];
      return [
        name,
        {
          cpuMicrosPerJob: Math.round(r.cpuMicros / jobs),
          cores: +(r.cpuMicros / r.wallMicros).toFixed(2),
          peakRssMb: mb(r.peakRssBytes),
          ...(cgroup
            ? { limitMiB: cgroup.limitMiB, cgroupPeakMiB: cgroup.peakMiB(), oomKills: cgroup.oomKills() }
            : {}),
        },
      ];
    }),
  ) as ChainWindow['processes'];
}

/** A window's answers by status, for a table: `202: 4000`. */
export const answersOf = (w: ChainWindow): string =>
  Object.entries(w.statuses)
    .map(([status, n]) => `${status}: ${n}`)
    .join(', ');

/** An open-loop window's figures as table cells. */
export function openLoopCells(r: OpenLoopWindow): Record<string, number | string> {
  return {
    sent: r.sent,
    answers: answersOf(r),
    arrived: r.arrived,
    twice: r.duplicates,
    missing: r.missing,
    strays: r.strays,
    'p50 ms': r.p50Ms,
    'p99 ms': r.p99Ms,
    'p99 ms from send': r.p99FromSendMs,
    'max ms': r.maxMs,
    'p50 first/last tenth': `${r.firstTenthP50Ms} / ${r.lastTenthP50Ms}`,
    'POST p50 ms': r.answerP50Ms,
    'POST p99 ms': r.answerP99Ms,
    'sender lag max ms': r.senderLagMaxMs,
    'load avg': r.loadAverage,
  };
}

/** What processesOf's cells say, for the line above their table. */
export const PROCESSES_LEGEND = (per: string): string =>
  `CPU µs per ${per}, cores busy, peak RSS MB; for the apps, in a memory cgroup of their Kubernetes limit: ` +
  "the cgroup's peak so far (RSS and page cache) / the limit, and its OOM kills";

/** A window's processes as table cells, one a process. */
export function processesOf(w: ChainWindow): Record<string, string> {
  return Object.fromEntries(
    Object.entries(w.processes).map(([name, p]) => [
      name,
      `${p.cpuMicrosPerJob} µs, ${p.cores}, ${p.peakRssMb} MB` +
        (p.limitMiB === undefined
          ? ['api', 'worker', 'relay'].includes(name)
            ? ' (no limit)'
            : ''
          : ` (${p.cgroupPeakMiB ?? 'n/a'} / ${p.limitMiB} MiB, ${p.oomKills} OOM)`),
    ]),
  );
}

async function takeArrivals(chain: RunningChain): Promise<Arrival[]> {
  const res = await fetch(`${chain.receiverUrl}/arrivals`);
  return (await res.json()) as Arrival[];
}
