import 'reflect-metadata';
import { Redis } from 'ioredis';
import { spawn } from 'node:child_process';
import { loadavg } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { Client } from 'pg';
import type { Arrival } from './e2e-servers/webhook-receiver.server';
import type { LoadReport } from './e2e-servers/open-loop.load';
import {
  freePort,
  meter,
  type Meter,
  type MeterReading,
  REPO_ROOT,
  spawnServer,
  type SpawnedServer,
} from './processes';
import { imageNodeOptions, kubernetesMemoryLimitMiB, type MemoryCgroup } from './memory-limit';
import { KEY, orderOf, percentile } from './support';
import { ourApps, type OurApps, startFakeModel } from './worker-side-by-side.bench';

/*
 * Issue 12, the whole chain under open-loop load: POST /v1/summaries to the
 * api, the worker (the model a local fake answering at once, through the
 * openai SDK), the relay, and the notification's arrival at a local webhook
 * receiver, each in a process of its own (the api, worker and relay are
 * their real main.ts, through ts-node). A load generator (its own process)
 * sends at a fixed rate whatever the answers; latency is the notification's
 * arrival minus the request's scheduled send time, matched by a unique
 * `notify` that the outbox payload carries back as `to`. Every notification
 * must arrive once: a second arrival for one job is counted (and must be 0).
 */

export interface EndToEndOptions {
  /** Default [200, 400]. */
  readonly rates?: readonly number[];
  /** Seconds of load per window; default 10. */
  readonly seconds?: number;
  /** Windows per rate, in rotated order; default 2. */
  readonly rounds?: number;
  /** LOG_LEVEL of the api, worker and relay; default info, as production runs. */
  readonly logLevel?: string;
  /** How the api, worker and relay run; default ourApps('js'). */
  readonly apps?: OurApps;
  /** How long to wait for the last notifications after the load ends; default 30 s. */
  readonly drainTimeoutMs?: number;
  /**
   * Runs the api, worker and relay as pods run them: each in a memory cgroup of its Kubernetes limit
   * (memory-limit.ts), with the image's NODE_OPTIONS; default true.
   */
  readonly memoryLimits?: boolean;
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

export interface EndToEndRow {
  readonly ratePerSecond: number;
  readonly round: number;
  readonly seconds: number;
  readonly sent: number;
  /** Answers by status. */
  readonly statuses: Readonly<Record<string, number>>;
  readonly arrived: number;
  /** Jobs whose notification arrived more than once (must be 0). */
  readonly duplicates: number;
  /** Notifications that did not match a request of this window. */
  readonly strays: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /**
   * p99 from the moment the sender actually sent each request: the system's own tail, without the sender's lag
   * (p99Ms, from the schedule, is what a user of an open system sees).
   */
  readonly p99FromSendMs: number;
  /** p50 of the first and of the last tenth of the requests by send time (a backlog that grows shows here). */
  readonly firstTenthP50Ms: number;
  readonly lastTenthP50Ms: number;
  /** The POST's own answer, from its scheduled time. */
  readonly answerP50Ms: number;
  readonly answerP99Ms: number;
  /** The most the generator's sends lagged their schedule. */
  readonly senderLagMaxMs: number;
  /** Failed POSTs by error (no answer). */
  readonly errors: Readonly<Record<string, number>>;
  /** The machine's 1-minute load average at the window's end (2 cores; other engineers' runs show up here). */
  readonly loadAverage: number;
  readonly processes: Readonly<Record<'api' | 'worker' | 'relay' | 'model' | 'receiver', ProcessUnderLoad>>;
}

const mb = (bytes: number): number => +(bytes / 2 ** 20).toFixed(1);
const ms = (x: number): number => +x.toFixed(1);

export async function benchEndToEnd(
  redisUrl: string,
  databaseUrl: string,
  options: EndToEndOptions = {},
): Promise<EndToEndRow[]> {
  const rates = options.rates ?? [200, 400];
  const seconds = options.seconds ?? 10;
  const rounds = options.rounds ?? 2;
  const logLevel = options.logLevel ?? 'info';
  const apps = options.apps ?? ourApps('js');
  // As a pod runs them: in a cgroup of the manifest's limit, with the image's NODE_OPTIONS.
  const limit = (app: 'api' | 'worker' | 'relay'): { memoryLimitMiB?: number } =>
    options.memoryLimits === false ? {} : { memoryLimitMiB: kubernetesMemoryLimitMiB(app) };
  const nodeOptions: Record<string, string> =
    options.memoryLimits === false ? {} : { NODE_OPTIONS: imageNodeOptions() };
  const redis = new Redis(redisUrl);
  await redis.flushdb();
  redis.disconnect();
  {
    const db = new Client({ connectionString: databaseUrl });
    await db.connect();
    await db.query('TRUNCATE summaries, outbox');
    await db.end();
  }
  const started: SpawnedServer[] = [];
  const start = async (server: Promise<SpawnedServer>): Promise<SpawnedServer> => {
    const s = await server;
    started.push(s);
    return s;
  };
  const rows: EndToEndRow[] = [];
  const died: string[] = [];
  let stopping = false;
  try {
    const model = await start(startFakeModel(0));
    const receiver = await start(
      spawnServer({
        name: 'webhook receiver',
        script: 'test/bench/e2e-servers/webhook-receiver.server.ts',
        ready: /listening on (http:\/\/\S+)/,
        stdout: 'ignore',
      }),
    );
    const common = { REDIS_URL: redisUrl, DATABASE_URL: databaseUrl, LOG_LEVEL: logLevel, ...nodeOptions };
    const [apiPort, workerPort, relayPort] = [await freePort(), await freePort(), await freePort()];
    const api = await start(
      spawnServer({
        name: 'api',
        ...apps.spawnOf('api'),
        ...limit('api'),
        env: {
          ...apps.spawnOf('api').env,
          ...common,
          PORT: String(apiPort),
          API_KEYS: `bench:${KEY}`,
          LLM_PROVIDER: 'fake',
        },
        ready: { url: `http://127.0.0.1:${apiPort}/health/live` },
      }),
    );
    const worker = await start(
      spawnServer({
        name: 'worker',
        ...apps.spawnOf('worker'),
        ...limit('worker'),
        env: {
          ...apps.spawnOf('worker').env,
          ...common,
          HEALTH_PORT: String(workerPort),
          WORKER_CONCURRENCY: '16',
          LLM_PROVIDER: 'openai',
          OPENAI_API_KEY: 'bench',
          OPENAI_BASE_URL: `${model.url}/v1`,
        },
        ready: { url: `http://127.0.0.1:${workerPort}/health/live` },
      }),
    );
    const relay = await start(
      spawnServer({
        name: 'relay',
        ...apps.spawnOf('relay'),
        ...limit('relay'),
        env: {
          ...apps.spawnOf('relay').env,
          ...common,
          HEALTH_PORT: String(relayPort),
          NOTIFY_WEBHOOK_URL: `${receiver.url}/notify`,
        },
        ready: { url: `http://127.0.0.1:${relayPort}/health/live` },
      }),
    );
    for (const s of [model, receiver, api, worker, relay])
      s.child.once('exit', (code, signal) => {
        if (!stopping) died.push(`${s.name} exited (code ${code}, signal ${signal}):\n${s.stderr().slice(-3000)}`);
      });
    const url = `http://127.0.0.1:${apiPort}/v1/summaries`;
    const pids = { api: api.pid, worker: worker.pid, relay: relay.pid, model: model.pid, receiver: receiver.pid };
    const cgroups = { api: api.memory, worker: worker.memory, relay: relay.memory };

    // Warm-up, not reported: the JIT, the pools' connections.
    await window(url, receiver, pids, cgroups, 100, 3, 'warmup', options.drainTimeoutMs ?? 30_000);
    if (died.length) throw new Error(died.join('\n'));
    for (let r = 0; r < rounds; r++) {
      for (const rate of orderOf(rates, r)) {
        const row = await window(
          url,
          receiver,
          pids,
          cgroups,
          rate,
          seconds,
          `r${r}-${rate}`,
          options.drainTimeoutMs ?? 30_000,
        );
        if (died.length) throw new Error(died.join('\n'));
        rows.push({ ...row, round: r });
      }
    }
  } catch (err) {
    if (died.length) throw new Error(died.join('\n'), { cause: err });
    throw err;
  } finally {
    stopping = true;
    for (const s of started.reverse()) await s.stop();
  }
  return rows;
}

async function window(
  url: string,
  receiver: SpawnedServer,
  pids: Record<keyof EndToEndRow['processes'], number>,
  cgroups: Readonly<Record<string, MemoryCgroup | undefined>>,
  rate: number,
  seconds: number,
  tag: string,
  drainTimeoutMs: number,
): Promise<Omit<EndToEndRow, 'round'>> {
  await takeArrivals(receiver); // nothing left over from before
  // Metered from the generator's first send (its own start-up, ts-node's compile, is not in the window).
  let meters: Record<string, Meter> = {};
  const stdout = await new Promise<string>((done, fail) => {
    const child = spawn(
      process.execPath,
      [
        '-r',
        require.resolve('ts-node/register'),
        'test/bench/e2e-servers/open-loop.load.ts',
        url,
        KEY,
        String(rate),
        String(seconds),
        tag,
      ],
      { cwd: REPO_ROOT, env: { ...process.env, TS_NODE_TRANSPILE_ONLY: 'true' }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      err += d;
      if (d.includes('sending'))
        meters = Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, meter(pid)]));
    });
    child.once('exit', (code) =>
      code === 0 ? done(Buffer.concat(out).toString('utf8')) : fail(new Error(`load generator: ${code}\n${err}`)),
    );
  });
  const load = JSON.parse(stdout) as LoadReport;
  const accepted = load.statuses['202'] ?? 0;
  const arrivals: Arrival[] = [];
  const deadline = performance.now() + drainTimeoutMs;
  const seen = new Set<string>();
  for (;;) {
    for (const a of await takeArrivals(receiver)) {
      arrivals.push(a);
      if (a.to in load.scheduled) seen.add(a.to);
    }
    if (seen.size >= accepted || performance.now() > deadline) break;
    await delay(100);
  }
  await delay(500); // a late duplicate would arrive now
  arrivals.push(...(await takeArrivals(receiver)));
  const readings = Object.fromEntries(Object.entries(meters).map(([name, m]) => [name, m.stop()])) as Record<
    keyof EndToEndRow['processes'],
    MeterReading
  >;

  const first = new Map<string, number>();
  let duplicates = 0;
  let strays = 0;
  for (const a of arrivals) {
    if (!(a.to in load.scheduled)) strays++;
    else if (first.has(a.to)) duplicates++;
    else first.set(a.to, a.at);
  }
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
  const jobs = Math.max(1, first.size);
  const processes = Object.fromEntries(
    Object.entries(readings).map(([name, r]) => [
      name,
      {
        cpuMicrosPerJob: Math.round(r.cpuMicros / jobs),
        cores: +(r.cpuMicros / r.wallMicros).toFixed(2),
        peakRssMb: mb(r.peakRssBytes),
        ...(cgroups[name]
          ? {
              limitMiB: cgroups[name].limitMiB,
              cgroupPeakMiB: cgroups[name].peakMiB(),
              oomKills: cgroups[name].oomKills(),
            }
          : {}),
      },
    ]),
  ) as EndToEndRow['processes'];
  return {
    ratePerSecond: rate,
    seconds,
    sent: load.sent,
    statuses: load.statuses,
    arrived: first.size,
    duplicates,
    strays,
    p50Ms: ms(percentile(latencies, 0.5)),
    p99Ms: ms(percentile(latencies, 0.99)),
    p99FromSendMs: ms(percentile(fromSend, 0.99)),
    maxMs: ms(latencies[latencies.length - 1] ?? NaN),
    firstTenthP50Ms: ms(tenth(0) ?? NaN),
    lastTenthP50Ms: ms(tenth(0.9) ?? NaN),
    answerP50Ms: ms(load.answerP50Ms),
    answerP99Ms: ms(load.answerP99Ms),
    senderLagMaxMs: ms(load.lagMaxMs),
    errors: load.errors,
    loadAverage: +loadavg()[0].toFixed(1),
    processes,
  };
}

async function takeArrivals(receiver: SpawnedServer): Promise<Arrival[]> {
  const res = await fetch(`${receiver.url}/arrivals`);
  return (await res.json()) as Arrival[];
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
      sent: r.sent,
      answers: Object.entries(r.statuses)
        .map(([status, n]) => `${status}: ${n}`)
        .join(', '),
      arrived: r.arrived,
      twice: r.duplicates,
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
    })),
  );
  for (const r of rows)
    if (Object.keys(r.errors).length)
      console.log(`  ${r.ratePerSecond}/s round ${r.round}: POSTs without an answer: ${JSON.stringify(r.errors)}`);
  console.log(
    'Each process under that load: CPU µs per job, cores busy, peak RSS MB; for the apps, in a memory cgroup of ' +
      "their Kubernetes limit: the cgroup's peak so far (RSS and page cache) / the limit, and its OOM kills",
  );
  console.table(
    rows.map((r) => ({
      'jobs/s': r.ratePerSecond,
      round: r.round,
      ...Object.fromEntries(
        Object.entries(r.processes).map(([name, p]) => [
          name,
          `${p.cpuMicrosPerJob} µs, ${p.cores}, ${p.peakRssMb} MB` +
            (p.limitMiB === undefined
              ? ['api', 'worker', 'relay'].includes(name)
                ? ' (no limit)'
                : ''
              : ` (${p.cgroupPeakMiB ?? 'n/a'} / ${p.limitMiB} MiB, ${p.oomKills} OOM)`),
        ]),
      ),
    })),
  );
}
