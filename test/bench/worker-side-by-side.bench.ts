import 'reflect-metadata';
import { jobIdFor, SummaryJobQueue } from '@app/summary-queue';
import { Redis } from 'ioredis';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { cpSync, existsSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { loadavg } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { promisify } from 'node:util';
import { Client } from 'pg';
import {
  freePort,
  meter,
  REPO_ROOT,
  sampleProcess,
  spawnServer,
  type SpawnedServer,
  type SpawnServerOptions,
} from './processes';
import { buildServers, harnessScript } from './servers/build';
import { median, orderOf } from './support';

/*
 * Issue 12: the project's worker against BullMQ doing the same job, each in a
 * process of its own, side by side in one run. The job, on both sides: the
 * pre-check (SELECT 1 FROM summaries), the model's call (ours: its own client
 * over node:http; BullMQ's side: the official openai SDK, as a team writes
 * it) against one local fake (test/bench/e2e-servers/fake-model.server.ts, a
 * process of its own), and the summary with its outbox row in one statement
 * (our SummaryWriter's SQL), at concurrency 16. Each round fills its queue
 * with all its jobs first (ours: SummaryJobQueue.enqueue, as the api does;
 * BullMQ: Queue.addBulk), so enqueueing is outside what is measured, then
 * starts the worker process and waits for every summary row.
 *
 * What each figure is:
 * - jobs/s: (rows − 1) / (last created_at − first created_at) of the round's
 *   summaries, PostgreSQL's own clock (created_at is now() of the writing
 *   transaction): from the first job finished to the last, so neither side's
 *   process start is in it.
 * - CPU µs/job: utime+stime of the worker process (/proc, 10 ms ticks) from
 *   the moment it was ready (ours: /health/live answers; BullMQ: after
 *   waitUntilReady) until the last row, over the jobs finished in that window.
 *   Same window for the fake model's process.
 * - Redis round trips/job: one more round per side and latency (up to 1000
 *   jobs, not timed: MONITOR slows Redis), with MONITOR on: the commands the
 *   side's clients sent to the bench's Redis database, from before the worker
 *   process started (after the fill) to the last row, start-up included. A
 *   script (EVALSHA) is one; each command of a MULTI block is one. Commands
 *   the scripts ran inside Redis are counted apart ("in scripts"). MONITOR
 *   names the database, so other clients of the same server (another
 *   engineer's tests) are not counted; INFO's total_commands_processed would
 *   count them, and Lua's inner calls too.
 * - PostgreSQL xacts/job: pg_stat_database xact_commit + xact_rollback of the
 *   bench's database over the worker process's whole life (read after it has
 *   exited, since PostgreSQL 15 flushes a busy backend's counters only every
 *   1 to 10 s), less the bench's own polls. Every statement either side sends
 *   outside BEGIN is one transaction, so this is statements (round trips) per
 *   job; it includes each pooled connection's start-up (a few dozen over the
 *   whole round, < 0.02/job). pg_stat_statements is installed but not
 *   preloaded on this server, so statements are not counted one by one.
 * - RSS: VmRSS when ready, and the highest VmRSS sampled every 100 ms while
 *   it ran. Ours runs as JavaScript built for the bench (ourApps), like the
 *   BullMQ side's plain JavaScript: under ts-node the TypeScript compiler
 *   would stay loaded in it.
 */

const PEER_DIR = join(REPO_ROOT, 'test/bench/peer/bullmq');
const BULLMQ_QUEUE = 'summaries-bullmq';
const run = promisify(execFile);

export type WorkerSide = 'ours' | 'bullmq';

export interface WorkerSideBySideOptions {
  /** Rounds per side and latency; default 5. */
  readonly rounds?: number;
  /** Jobs per round at model latency 0 and at the slow latency; default 3000 and 1600. */
  readonly jobsFast?: number;
  readonly jobsSlow?: number;
  /** Default [0, 50]. */
  readonly latenciesMs?: readonly number[];
  readonly concurrency?: number;
  /** Our worker's LOG_LEVEL; default info, as production runs (a line per job; the BullMQ side logs nothing). */
  readonly logLevel?: string;
  /** How our worker runs; default ourApps('js'). */
  readonly apps?: OurApps;
  /** Called with each round's figures as it ends. */
  readonly onRound?: (round: WorkerRound) => void;
}

export interface WorkerRound {
  readonly side: WorkerSide;
  readonly modelLatencyMs: number;
  readonly round: number;
  readonly jobs: number;
  readonly jobsPerSecond: number;
  readonly cpuMicrosPerJob: number;
  readonly modelCpuMicrosPerJob: number;
  /** The fake's mean ms per answer as served (request read to answer written), over the same window. */
  readonly modelAnswerMs: number;
  readonly postgresXactsPerJob: number;
  readonly readyRssBytes: number;
  readonly peakRssBytes: number;
  /** Jobs the worker had finished before its ready point (not in the CPU window). */
  readonly doneBeforeReady: number;
  /** The machine's 1-minute load average at the round's end (2 cores; other engineers' runs show up here). */
  readonly loadAverage: number;
  /** Only in the counting round, which runs under MONITOR (and is not timed). */
  readonly traffic?: RedisTraffic;
}

export interface WorkerSideBySideRow {
  readonly side: WorkerSide;
  readonly modelLatencyMs: number;
  readonly concurrency: number;
  readonly rounds: number;
  readonly jobsPerRound: number;
  /** Medians over the rounds, and the spread of jobs/s. */
  readonly jobsPerSecond: number;
  readonly jobsPerSecondMin: number;
  readonly jobsPerSecondMax: number;
  readonly cpuMicrosPerJob: number;
  readonly modelCpuMicrosPerJob: number;
  /** Median of the rounds' mean ms per answer as the fake served it. */
  readonly modelAnswerMs: number;
  /** How long each slot took per job: concurrency × 1000 / jobs/s (the model's answer, and what the worker adds). */
  readonly slotMsPerJob: number;
  /** From one extra, untimed round per side under MONITOR: commands its clients sent per job, scripts counted once. */
  readonly redisRoundTripsPerJob: number;
  /** The same round: commands Redis ran inside scripts, per job. */
  readonly redisInScriptPerJob: number;
  /** The same round: the commands sent per job, by name. */
  readonly redisByCommandPerJob: Readonly<Record<string, number>>;
  readonly postgresXactsPerJob: number;
  readonly readyRssMb: number;
  readonly peakRssMb: number;
  /** The machine's load average over the rounds, min–max. */
  readonly loadMin: number;
  readonly loadMax: number;
  /** Ours: median jobs/s over BullMQ's, and the min–max of the same round's ratio. */
  readonly overBullmq?: number;
  readonly overBullmqMin?: number;
  readonly overBullmqMax?: number;
  /** Median jobs/s over concurrency / latency (latency > 0 only). */
  readonly overCeiling?: number;
}

/** How our apps' processes are started: their main.ts as JavaScript built for the bench, or through ts-node. */
export interface OurApps {
  /** spawnServer's script, nodeArgs and env for apps/<app>/src/main.ts. */
  spawnOf(app: 'api' | 'worker' | 'relay'): {
    script: string;
    nodeArgs?: SpawnServerOptions['nodeArgs'];
    env?: SpawnServerOptions['env'];
  };
  readonly how: string;
}

/**
 * Our apps as plain JavaScript (test/bench/servers/build.ts's buildServers:
 * ts-node would keep the TypeScript compiler loaded in each process, some
 * 200 MiB of RSS and its source-map hooks, which the BullMQ side, plain
 * JavaScript, does not have). buildServers rebuilds a directory other benches
 * share, so the build is copied to a directory of this bench's own at once,
 * and rebuilding it under a running bench does not take its files away.
 * `ts-node` runs main.ts as it is instead.
 */
export function ourApps(mode: 'js' | 'ts-node' = 'js'): OurApps {
  const mainOf = (app: string) => `apps/${app}/src/main.ts`;
  if (mode === 'ts-node') return { how: 'ts-node (transpile-only)', spawnOf: (app) => ({ script: mainOf(app) }) };
  const built = buildServers();
  const own = resolve(REPO_ROOT, 'node_modules/.cache/llmwf-bench-js-worker-e2e');
  rmSync(own, { recursive: true, force: true });
  cpSync(built.dir, own, { recursive: true });
  const env = { TS_NODE_PROJECT: join(own, 'tsconfig.json'), TS_NODE_BASEURL: own };
  return {
    how: 'JavaScript built by test/bench/servers/build.ts',
    spawnOf: (app) => ({
      script: join(own, relative(built.dir, built.jsOf(mainOf(app)))),
      nodeArgs: built.nodeArgs,
      env,
    }),
  };
}

/** Installs the BullMQ side's own dependencies (its package-lock.json) when they are missing. */
export async function ensurePeerInstalled(): Promise<void> {
  if (existsSync(join(PEER_DIR, 'node_modules/bullmq'))) return;
  await run('npm', ['ci', '--prefix', PEER_DIR, '--no-audit', '--no-fund'], { cwd: REPO_ROOT });
}

/** The fake model (its own process), answering after `latencyMs`. */
export async function startFakeModel(latencyMs: number): Promise<SpawnedServer> {
  return spawnServer({
    name: `fake model (${latencyMs} ms)`,
    script: harnessScript('fake-model.server.ts'),
    args: ['0', String(latencyMs)],
    ready: /listening on (http:\/\/\S+)/,
    stdout: 'ignore',
  });
}

/** What one side's clients sent to Redis database `db`, as MONITOR shows it. */
export interface RedisTraffic {
  /** Commands clients sent (a script is one, EVALSHA; each command of a MULTI block is one). */
  readonly sent: number;
  /** Commands scripts ran inside Redis (MONITOR's `lua` source). */
  readonly inScripts: number;
  readonly byCommand: Readonly<Record<string, number>>;
}

/**
 * Counts, until stop(), the commands MONITOR shows for database `db` (other
 * databases' traffic is skipped). On a socket of its own, parsed here: ioredis
 * in monitor mode throws from its reply parser when lines still arrive while
 * it disconnects.
 */
export async function monitorRedis(redisUrl: string, db: number): Promise<{ stop(): RedisTraffic }> {
  const url = new URL(redisUrl);
  const socket = connect(Number(url.port || 6379), url.hostname);
  await once(socket, 'connect');
  if (url.password)
    socket.write(`AUTH ${decodeURIComponent(url.username || 'default')} ${decodeURIComponent(url.password)}\r\n`);
  socket.write('MONITOR\r\n');
  let sent = 0;
  let inScripts = 0;
  let stopped = false;
  const byCommand: Record<string, number> = {};
  let partial = '';
  // `+1700000000.123456 [13 127.0.0.1:5555] "XACK" ...`; scripts' commands say `[13 lua]`.
  const line = /^\+\d+\.\d+ \[(\d+) ([^\]]+)\] "([^"]*)"/;
  socket.setEncoding('utf8');
  let ready!: () => void;
  const ok = new Promise<void>((r) => (ready = r));
  socket.on('data', (chunk: string) => {
    if (stopped) return;
    const lines = (partial + chunk).split('\r\n');
    partial = lines.pop() ?? '';
    for (const l of lines) {
      if (l === '+OK') ready();
      const m = line.exec(l);
      if (!m || Number(m[1]) !== db) continue;
      if (m[2] === 'lua') {
        inScripts++;
        continue;
      }
      sent++;
      const name = m[3].toLowerCase();
      byCommand[name] = (byCommand[name] ?? 0) + 1;
    }
  });
  socket.on('error', () => undefined);
  await ok;
  return {
    stop() {
      stopped = true;
      socket.destroy();
      return { sent, inScripts, byCommand };
    },
  };
}

const mb = (bytes: number): number => +(bytes / 2 ** 20).toFixed(1);
const fixed = (x: number, digits = 2): number => +x.toFixed(digits);

async function xacts(admin: Client, database: string): Promise<number> {
  const { rows } = await admin.query<{ n: string }>(
    'SELECT xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = $1',
    [database],
  );
  return Number(rows[0].n);
}

export async function benchWorkerSideBySide(
  redisUrl: string,
  databaseUrl: string,
  options: WorkerSideBySideOptions = {},
): Promise<WorkerSideBySideRow[]> {
  const rounds = options.rounds ?? 5;
  const concurrency = options.concurrency ?? 16;
  const latencies = options.latenciesMs ?? [0, 50];
  await ensurePeerInstalled();
  const apps = options.apps ?? ourApps('js');
  const database = new URL(databaseUrl).pathname.slice(1);
  // Reads pg_stat_database from another database, so its own transactions are not counted.
  const adminUrl = new URL(databaseUrl);
  adminUrl.pathname = '/postgres';
  const admin = new Client({ connectionString: adminUrl.toString() });
  await admin.connect();
  const redis = new Redis(redisUrl);
  const rows: WorkerSideBySideRow[] = [];
  const common = (latency: number, model: SpawnedServer, jobs: number, round: number): RoundContext => ({
    redisUrl,
    redisDb: Number(new URL(redisUrl).pathname.slice(1) || 0),
    databaseUrl,
    database,
    admin,
    redis,
    modelUrl: model.url! + '/v1',
    modelPid: model.pid,
    latency,
    jobs,
    concurrency,
    round,
    logLevel: options.logLevel ?? 'info',
    apps,
    monitor: false,
  });
  try {
    for (const latency of latencies) {
      const jobs = latency === 0 ? (options.jobsFast ?? 3000) : (options.jobsSlow ?? 1600);
      const model = await startFakeModel(latency);
      const samples: WorkerRound[] = [];
      const counted: WorkerRound[] = [];
      try {
        for (let r = 0; r < rounds; r++) {
          for (const side of orderOf<WorkerSide>(['ours', 'bullmq'], r)) {
            const sample = await oneRound(side, common(latency, model, jobs, r));
            samples.push(sample);
            options.onRound?.(sample);
          }
        }
        for (const side of ['ours', 'bullmq'] as const) {
          const sample = await oneRound(side, {
            ...common(latency, model, Math.min(jobs, 1000), rounds),
            monitor: true,
          });
          counted.push(sample);
          options.onRound?.(sample);
        }
      } finally {
        await model.stop();
      }
      rows.push(...summarise(samples, counted, latency, concurrency, rounds, jobs));
    }
  } finally {
    await redis.flushdb();
    redis.disconnect();
    await admin.end();
  }
  return rows;
}

function summarise(
  samples: readonly WorkerRound[],
  counted: readonly WorkerRound[],
  latency: number,
  concurrency: number,
  rounds: number,
  jobs: number,
): WorkerSideBySideRow[] {
  const of = (side: WorkerSide) => samples.filter((s) => s.side === side);
  const medianOf = (side: WorkerSide, f: (s: WorkerRound) => number) => median(of(side).map(f));
  const ratios = of('ours').map((o) => o.jobsPerSecond / of('bullmq').find((b) => b.round === o.round)!.jobsPerSecond);
  return (['bullmq', 'ours'] as const).map((side) => {
    const perSecond = of(side).map((s) => s.jobsPerSecond);
    const count = counted.find((s) => s.side === side)!;
    const traffic = count.traffic!;
    const byCommand = Object.fromEntries(
      Object.entries(traffic.byCommand)
        .sort(([, a], [, b]) => b - a)
        .map(([name, n]) => [name, fixed(n / count.jobs)]),
    );
    const jobsPerSecond = Math.round(median(perSecond));
    return {
      side,
      modelLatencyMs: latency,
      concurrency,
      rounds,
      jobsPerRound: jobs,
      jobsPerSecond,
      jobsPerSecondMin: Math.round(Math.min(...perSecond)),
      jobsPerSecondMax: Math.round(Math.max(...perSecond)),
      cpuMicrosPerJob: Math.round(medianOf(side, (s) => s.cpuMicrosPerJob)),
      modelCpuMicrosPerJob: Math.round(medianOf(side, (s) => s.modelCpuMicrosPerJob)),
      modelAnswerMs: fixed(medianOf(side, (s) => s.modelAnswerMs)),
      slotMsPerJob: fixed((concurrency * 1000) / medianOf(side, (s) => s.jobsPerSecond)),
      redisRoundTripsPerJob: fixed(traffic.sent / count.jobs),
      redisInScriptPerJob: fixed(traffic.inScripts / count.jobs),
      redisByCommandPerJob: byCommand,
      postgresXactsPerJob: fixed(medianOf(side, (s) => s.postgresXactsPerJob)),
      readyRssMb: mb(medianOf(side, (s) => s.readyRssBytes)),
      peakRssMb: mb(Math.max(...of(side).map((s) => s.peakRssBytes))),
      loadMin: Math.min(...of(side).map((s) => s.loadAverage)),
      loadMax: Math.max(...of(side).map((s) => s.loadAverage)),
      ...(side === 'ours'
        ? {
            overBullmq: fixed(median(perSecond) / median(of('bullmq').map((s) => s.jobsPerSecond))),
            overBullmqMin: fixed(Math.min(...ratios)),
            overBullmqMax: fixed(Math.max(...ratios)),
          }
        : {}),
      ...(latency > 0 ? { overCeiling: fixed(median(perSecond) / (concurrency / (latency / 1000))) } : {}),
    };
  });
}

interface RoundContext {
  readonly redisUrl: string;
  readonly redisDb: number;
  readonly databaseUrl: string;
  readonly database: string;
  readonly admin: Client;
  readonly redis: Redis;
  readonly modelUrl: string;
  readonly modelPid: number;
  readonly latency: number;
  readonly jobs: number;
  readonly concurrency: number;
  readonly round: number;
  readonly logLevel: string;
  readonly apps: OurApps;
  /** The counting round: MONITOR on (it slows Redis, so its figures other than the traffic are not used). */
  readonly monitor: boolean;
}

async function oneRound(side: WorkerSide, ctx: RoundContext): Promise<WorkerRound> {
  const { jobs } = ctx;
  await ctx.redis.flushdb();
  {
    const db = new Client({ connectionString: ctx.databaseUrl });
    await db.connect();
    await db.query('TRUNCATE summaries, outbox');
    await db.end();
  }
  await fill(side, ctx);

  await delay(200); // the TRUNCATE's backend has exited and flushed its counters
  const xacts0 = await xacts(ctx.admin, ctx.database);
  const monitor = ctx.monitor ? await monitorRedis(ctx.redisUrl, ctx.redisDb) : undefined;
  const worker = await startWorker(side, ctx);
  const poller = new Client({ connectionString: ctx.databaseUrl });
  let polls = 0;
  try {
    await poller.connect();
    const count = async (): Promise<number> => {
      polls++;
      const { rows } = await poller.query<{ n: number }>('SELECT count(*)::int AS n FROM summaries');
      return rows[0].n;
    };
    const readyRss = sampleProcess(worker.pid).rssBytes;
    const workerMeter = meter(worker.pid);
    const modelMeter = meter(ctx.modelPid);
    const served0 = await modelServed(ctx.modelUrl);
    const doneBeforeReady = await count();
    const deadline = performance.now() + 120_000;
    while ((await count()) < jobs) {
      if (performance.now() > deadline) throw new Error(`${side}: not all ${jobs} jobs done within 120 s`);
      await delay(20);
    }
    const workerReading = workerMeter.stop();
    const modelReading = modelMeter.stop();
    const served = await modelServed(ctx.modelUrl);
    const traffic = monitor?.stop();
    const { rows: span } = await poller.query<{ n: number; seconds: number }>(
      `SELECT count(*)::int AS n, extract(epoch FROM max(created_at) - min(created_at))::float8 AS seconds FROM summaries`,
    );
    polls++;
    const { rows: outbox } = await poller.query<{ n: number }>('SELECT count(*)::int AS n FROM outbox');
    polls++;
    if (span[0].n !== jobs || outbox[0].n !== jobs)
      throw new Error(`${side}: ${span[0].n} summaries and ${outbox[0].n} outbox rows for ${jobs} jobs`);
    await poller.end();
    await worker.stop();
    await delay(200); // their backends exit and flush their counters
    const xactsDone = (await xacts(ctx.admin, ctx.database)) - xacts0 - polls - 1; // -1: the poller's connection start
    const inWindow = jobs - doneBeforeReady;
    return {
      side,
      modelLatencyMs: ctx.latency,
      round: ctx.round,
      jobs,
      jobsPerSecond: (span[0].n - 1) / span[0].seconds,
      cpuMicrosPerJob: workerReading.cpuMicros / inWindow,
      modelCpuMicrosPerJob: modelReading.cpuMicros / inWindow,
      modelAnswerMs: (served.heldMsTotal - served0.heldMsTotal) / Math.max(1, served.answered - served0.answered),
      postgresXactsPerJob: xactsDone / jobs,
      readyRssBytes: readyRss,
      peakRssBytes: workerReading.peakRssBytes,
      doneBeforeReady,
      loadAverage: +loadavg()[0].toFixed(1),
      ...(traffic ? { traffic } : {}),
    };
  } catch (err) {
    monitor?.stop();
    await poller.end().catch(() => undefined);
    await worker.stop(2000);
    throw new Error(`${side} round ${ctx.round}: ${(err as Error).message}\n${worker.stderr().slice(-2000)}`, {
      cause: err,
    });
  }
}

/** What the fake model has served so far: answers, and the ms it held them in all. */
async function modelServed(modelUrl: string): Promise<{ answered: number; heldMsTotal: number }> {
  const res = await fetch(new URL('/count', modelUrl));
  return (await res.json()) as { answered: number; heldMsTotal: number };
}

/** The round's jobs, all queued before the worker starts. */
async function fill(side: WorkerSide, ctx: RoundContext): Promise<void> {
  if (side === 'bullmq') {
    const { stdout } = await run(process.execPath, ['fill.mjs', String(ctx.jobs), 'Bench me.', 'bench'], {
      cwd: PEER_DIR,
      env: { ...process.env, REDIS_URL: ctx.redisUrl, QUEUE: BULLMQ_QUEUE },
    });
    if (!stdout.includes(`filled ${ctx.jobs}`)) throw new Error(`bullmq fill: ${stdout}`);
    return;
  }
  await enqueueBenchJobs(new SummaryJobQueue(ctx.redis), ctx.jobs);
}

/** `jobs` fresh summary jobs, as the api enqueues them, 200 at a time. */
export async function enqueueBenchJobs(queue: SummaryJobQueue, jobs: number): Promise<void> {
  const runId = randomUUID();
  for (let i = 0; i < jobs; i += 200) {
    const batch: Promise<string>[] = [];
    for (let j = i; j < Math.min(jobs, i + 200); j++)
      batch.push(
        queue.enqueue({
          jobId: jobIdFor(`bench:POST:/v1/summaries:${runId}-${j}`),
          tenant: 'bench',
          payload: { text: 'Bench me.', notify: `bench-${j}@example.com` },
        }),
      );
    await Promise.all(batch);
  }
}

/**
 * BENCH_CPU_PROF=<dir>: each worker process (both sides) writes a V8 CPU
 * profile there when it exits (`--cpu-prof`), to read before optimising.
 */
function profileArgs(): string[] {
  const dir = process.env.BENCH_CPU_PROF;
  return dir ? ['--cpu-prof', `--cpu-prof-dir=${resolve(dir)}`] : [];
}

async function startWorker(side: WorkerSide, ctx: RoundContext): Promise<SpawnedServer> {
  if (side === 'bullmq')
    return spawnServer({
      name: 'bullmq worker',
      script: 'worker.mjs',
      nodeArgs: profileArgs(),
      cwd: PEER_DIR,
      env: {
        REDIS_URL: ctx.redisUrl,
        DATABASE_URL: ctx.databaseUrl,
        OPENAI_BASE_URL: ctx.modelUrl,
        CONCURRENCY: String(ctx.concurrency),
        QUEUE: BULLMQ_QUEUE,
      },
      ready: /bullmq worker ready/,
      stdout: 'ignore',
    });
  const port = await freePort();
  const how = ctx.apps.spawnOf('worker');
  return spawnServer({
    name: 'worker',
    ...how,
    nodeArgs: [...(how.nodeArgs ?? []), ...profileArgs()],
    env: {
      ...how.env,
      REDIS_URL: ctx.redisUrl,
      DATABASE_URL: ctx.databaseUrl,
      LOG_LEVEL: ctx.logLevel,
      HEALTH_PORT: String(port),
      WORKER_CONCURRENCY: String(ctx.concurrency),
      LLM_PROVIDER: 'openai',
      OPENAI_API_KEY: 'bench',
      OPENAI_BASE_URL: ctx.modelUrl,
    },
    ready: { url: `http://127.0.0.1:${port}/health/live` },
    stdout: 'ignore',
  });
}

/** The table of benchWorkerSideBySide's rows. */
export function printWorkerSideBySide(rows: readonly WorkerSideBySideRow[]): void {
  console.log(
    'Worker side by side, each in its own process, the model a local fake (ours over node:http, BullMQ through the openai SDK): medians of alternating rounds',
  );
  console.table(
    rows.map((r) => ({
      worker: r.side === 'ours' ? 'ours (apps/worker)' : 'BullMQ',
      'model ms': r.modelLatencyMs,
      concurrency: r.concurrency,
      'rounds x jobs': `${r.rounds} x ${r.jobsPerRound}`,
      'jobs/s': r.jobsPerSecond,
      'jobs/s min-max': `${r.jobsPerSecondMin}-${r.jobsPerSecondMax}`,
      'ours/BullMQ': r.overBullmq === undefined ? '' : `${r.overBullmq} (${r.overBullmqMin}-${r.overBullmqMax})`,
      '/ceiling': r.overCeiling ?? '',
      'CPU µs/job': r.cpuMicrosPerJob,
      'model CPU µs/job': r.modelCpuMicrosPerJob,
      'slot ms/job': r.slotMsPerJob,
      'model ms/answer': r.modelAnswerMs,
      'Redis round trips/job': r.redisRoundTripsPerJob,
      'Redis cmds in scripts/job': r.redisInScriptPerJob,
      'PG xacts/job': r.postgresXactsPerJob,
      'RSS ready MB': r.readyRssMb,
      'RSS peak MB': r.peakRssMb,
      'load avg': `${r.loadMin}-${r.loadMax}`,
    })),
  );
  console.log('Redis commands sent per job, by name (the MONITOR round):');
  for (const r of rows)
    console.log(
      `  ${r.side}, model ${r.modelLatencyMs} ms: ${Object.entries(r.redisByCommandPerJob)
        .map(([name, n]) => `${name} ${n}`)
        .join(', ')}`,
    );
}
