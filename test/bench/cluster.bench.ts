import 'reflect-metadata';
import { keySlot } from '@app/redis';
import { SummaryJobQueue, SummaryStreams } from '@app/summary-queue';
import { Cluster, Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { loadavg } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { Client } from 'pg';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';
import { startLoadGenerator, type LoadGenerator } from './load';
import { freePort, meter, spawnServer, type SpawnedServer } from './processes';
import { buildServers } from './servers/build';
import { KEY, median, orderOf } from './support';
import { enqueueBenchJobs, ourApps, startFakeModel, type OurApps } from './worker-side-by-side.bench';

/*
 * Issue 13: the api and the worker on one Redis against the same on a local
 * Redis Cluster (three masters with a replica each, on this machine's
 * loopback, test/support/redis-cluster.ts), side by side in alternating
 * rounds, and how evenly the partitioned stream spreads the jobs.
 *
 * - one Redis: today's layout, one stream (JOB_STREAM_PARTITIONS=1);
 * - cluster: REDIS_CLUSTER_NODES and JOB_STREAM_PARTITIONS=3, so each master
 *   holds one partition, and every acknowledged write waits for a replica
 *   (WAIT 1, RedisModule's durability on a cluster).
 *
 * On one machine a cluster only costs: its six redis-servers share the same
 * 2 cores with everything else, and the extra hop of WAIT is latency. What
 * it buys (shards that grow with the load, surviving a master) needs several
 * machines; these figures say what a request and a job pay for it.
 */

/** A port block of the bench's own, clear of the test runs' (16000 + slot * 100 + worker * 10). */
const CLUSTER_BASE_PORT = 16900;
const PARTITIONS = 3;

export interface ClusterBenchOptions {
  readonly rounds?: number;
  readonly seconds?: number;
  readonly jobs?: number;
}

export interface ClusterSideRow {
  readonly side: 'one Redis' | 'cluster';
  readonly what: 'api first request' | 'worker, model at once';
  readonly rounds: number;
  readonly perSecond: number;
  readonly perSecondMin: number;
  readonly perSecondMax: number;
  readonly cpuMicrosPer: number;
  readonly p99Ms?: number;
}

export interface ClusterBenchResult {
  readonly rows: readonly ClusterSideRow[];
  /** Jobs per partition the api's cluster rounds enqueued, and the share of each. */
  readonly partitions: readonly { readonly partition: number; readonly master: number; readonly jobs: number }[];
  /** EVALSHA calls each master ran during the api's cluster rounds (scripts are the api's writes). */
  readonly masters: readonly { readonly port: number; readonly scripts: number }[];
  readonly clusterStartMs: number;
}

export async function benchCluster(
  redisUrl: string,
  databaseUrl: string,
  options: ClusterBenchOptions = {},
): Promise<ClusterBenchResult> {
  const rounds = options.rounds ?? 4;
  const seconds = options.seconds ?? 5;
  const jobs = options.jobs ?? 2000;
  const cluster = await startRedisCluster({ basePort: CLUSTER_BASE_PORT });
  const clusterClient = new Cluster(
    cluster.seedNodes.map((n) => ({ ...n })),
    { redisOptions: { disconnectTimeout: 100 } },
  );
  const single = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  const servers: SpawnedServer[] = [];
  let load: LoadGenerator | undefined;
  try {
    const built = buildServers();
    const env = (side: ClusterSideRow['side']): Record<string, string> =>
      side === 'cluster'
        ? { REDIS_CLUSTER_NODES: cluster.seedNodesEnv, JOB_STREAM_PARTITIONS: String(PARTITIONS) }
        : { REDIS_URL: redisUrl, JOB_STREAM_PARTITIONS: '1' };
    const startApi = async (side: ClusterSideRow['side']): Promise<SpawnedServer> => {
      const port = await freePort();
      const server = await spawnServer({
        name: `api (${side})`,
        script: built.jsOf('test/bench/servers/ours.ts'),
        nodeArgs: built.nodeArgs,
        env: {
          NODE_ENV: 'production',
          LOG_LEVEL: 'info',
          DATABASE_URL: databaseUrl,
          API_KEYS: `bench:${KEY}`,
          ...built.env,
          ...env(side),
          PORT: String(port),
        },
        ready: { url: `http://127.0.0.1:${port}/metrics` },
        stdout: 'ignore',
      });
      servers.push(server);
      return server;
    };
    const apis = { 'one Redis': await startApi('one Redis'), cluster: await startApi('cluster') };
    load = await startLoadGenerator();
    const sides = ['one Redis', 'cluster'] as const;
    const runApi = (side: ClusterSideRow['side'], durationSeconds: number) =>
      load!.run({
        url: `${apis[side].url}/v1/summaries`,
        headers: {
          authorization: `Bearer ${KEY}`,
          'content-type': 'application/json',
          'idempotency-key': `cluster-bench-${randomUUID()}-[<id>]`,
        },
        body: JSON.stringify({ text: 'Shards cost a hop.', notify: 'bench@example.com' }),
        freshIds: true,
        connections: 32,
        durationSeconds,
        status: 202,
        replayed: false,
      });
    for (const side of sides) await runApi(side, 2); // warm-up: JIT, pools, scripts
    await single.flushdb();
    await cluster.flushAll();
    const scripts0 = await scriptCalls(cluster);
    const api: Record<string, { perSecond: number; cpu: number; p99: number }[]> = { 'one Redis': [], cluster: [] };
    for (let r = 0; r < rounds; r++)
      for (const side of orderOf(sides, r)) {
        for (const s of servers) s.assertRunning();
        const m = meter(apis[side].pid);
        const result = await runApi(side, seconds);
        const reading = m.stop();
        api[side].push({ perSecond: result.perSecond, cpu: reading.cpuMicros / result.requests, p99: result.p99Ms });
      }
    const scripts1 = await scriptCalls(cluster);
    const layout = new SummaryStreams(PARTITIONS);
    const partitions = await Promise.all(
      layout.partitions.map(async (p) => ({
        partition: p.index,
        master: await cluster.masterOf(keySlot(p.jobs)),
        jobs: await clusterClient.xlen(p.jobs),
      })),
    );
    const masters = [...scripts1].map(([port, calls]) => ({ port, scripts: calls - (scripts0.get(port) ?? 0) }));
    for (const s of servers.splice(0)) await s.stop();
    await load.stop();
    load = undefined;

    // The worker: a queue filled first, then a worker process run until every job is a row.
    const apps = ourApps('js');
    const model = await startFakeModel(0);
    servers.push(model);
    const worker: Record<string, { perSecond: number; cpu: number }[]> = { 'one Redis': [], cluster: [] };
    for (let r = 0; r < Math.max(2, rounds - 1); r++)
      for (const side of orderOf(sides, r)) {
        worker[side].push(
          await workerRound(side, {
            jobs,
            apps,
            databaseUrl,
            modelUrl: `${model.url}/v1`,
            env: env(side),
            queue:
              side === 'cluster'
                ? new SummaryJobQueue(clusterClient, layout)
                : new SummaryJobQueue(single, new SummaryStreams(1)),
            flush: side === 'cluster' ? () => cluster.flushAll() : () => single.flushdb().then(() => undefined),
          }),
        );
      }
    const row = (
      side: ClusterSideRow['side'],
      what: ClusterSideRow['what'],
      samples: { perSecond: number; cpu: number; p99?: number }[],
    ): ClusterSideRow => ({
      side,
      what,
      rounds: samples.length,
      perSecond: Math.round(median(samples.map((s) => s.perSecond))),
      perSecondMin: Math.round(Math.min(...samples.map((s) => s.perSecond))),
      perSecondMax: Math.round(Math.max(...samples.map((s) => s.perSecond))),
      cpuMicrosPer: Math.round(median(samples.map((s) => s.cpu))),
      ...(samples[0]?.p99 === undefined ? {} : { p99Ms: median(samples.map((s) => s.p99 ?? NaN)) }),
    });
    return {
      rows: [
        row('one Redis', 'api first request', api['one Redis']),
        row('cluster', 'api first request', api.cluster),
        row('one Redis', 'worker, model at once', worker['one Redis']),
        row('cluster', 'worker, model at once', worker.cluster),
      ],
      partitions,
      masters,
      clusterStartMs: cluster.startMs,
    };
  } finally {
    await load?.stop().catch(() => undefined);
    for (const s of servers) await s.stop().catch(() => undefined);
    clusterClient.disconnect();
    single.disconnect();
    await cluster.stop();
  }
}

interface WorkerRoundContext {
  readonly jobs: number;
  readonly apps: OurApps;
  readonly databaseUrl: string;
  readonly modelUrl: string;
  readonly env: Record<string, string>;
  readonly queue: SummaryJobQueue;
  flush(): Promise<void>;
}

async function workerRound(
  side: ClusterSideRow['side'],
  ctx: WorkerRoundContext,
): Promise<{ perSecond: number; cpu: number }> {
  await ctx.flush();
  const db = new Client({ connectionString: ctx.databaseUrl });
  await db.connect();
  try {
    await db.query('TRUNCATE summaries, outbox');
    await enqueueBenchJobs(ctx.queue, ctx.jobs);
    const port = await freePort();
    const how = ctx.apps.spawnOf('worker');
    const worker = await spawnServer({
      name: `worker (${side})`,
      ...how,
      env: {
        ...how.env,
        ...ctx.env,
        DATABASE_URL: ctx.databaseUrl,
        LOG_LEVEL: 'info',
        HEALTH_PORT: String(port),
        WORKER_CONCURRENCY: '16',
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'bench',
        OPENAI_BASE_URL: ctx.modelUrl,
      },
      ready: { url: `http://127.0.0.1:${port}/health/live` },
      stdout: 'ignore',
    });
    try {
      const m = meter(worker.pid);
      const count = async () => (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM summaries')).rows[0].n;
      const before = await count();
      const deadline = performance.now() + 120_000;
      while ((await count()) < ctx.jobs) {
        worker.assertRunning();
        if (performance.now() > deadline) throw new Error(`worker (${side}): not all ${ctx.jobs} jobs done in 120 s`);
        await delay(20);
      }
      const reading = m.stop();
      const { rows } = await db.query<{ n: number; seconds: number }>(
        `SELECT count(*)::int AS n, extract(epoch FROM max(created_at) - min(created_at))::float8 AS seconds FROM summaries`,
      );
      return { perSecond: (rows[0].n - 1) / rows[0].seconds, cpu: reading.cpuMicros / (ctx.jobs - before) };
    } finally {
      await worker.stop();
    }
  } finally {
    await db.end();
  }
}

/** EVALSHA and EVAL calls each master has run (INFO commandstats), by port. */
async function scriptCalls(cluster: RedisCluster): Promise<Map<number, number>> {
  const calls = new Map<number, number>();
  for (const master of await cluster.masters()) {
    const info = String(await cluster.command(master.port, 'INFO', 'commandstats'));
    const of = (cmd: string) => Number(new RegExp(`^cmdstat_${cmd}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
    calls.set(master.port, of('evalsha') + of('eval'));
  }
  return calls;
}

/** The tables of benchCluster's result. */
export function printCluster(result: ClusterBenchResult): void {
  console.log(
    `One Redis against a local Redis Cluster (3 masters, 3 replicas, started in ${result.clusterStartMs} ms; ` +
      `JOB_STREAM_PARTITIONS=${PARTITIONS}, WAIT for one replica on every accepted write): medians of alternating ` +
      `rounds, load ${loadavg()
        .map((x) => x.toFixed(2))
        .join(' ')}`,
  );
  console.table(
    result.rows.map((r) => ({
      side: r.side,
      what: r.what,
      rounds: r.rounds,
      'per s': r.perSecond,
      'per s min-max': `${r.perSecondMin}-${r.perSecondMax}`,
      'CPU µs each': r.cpuMicrosPer,
      'p99 ms': r.p99Ms ?? '',
    })),
  );
  const total = result.partitions.reduce((n, p) => n + p.jobs, 0) || 1;
  console.log('How the api rounds spread over the cluster: jobs per partition, and scripts each master ran');
  console.table(
    result.partitions.map((p) => ({
      partition: p.partition,
      master: p.master,
      jobs: p.jobs,
      share: `${((100 * p.jobs) / total).toFixed(1)}%`,
      'scripts on that master': result.masters.find((m) => m.port === p.master)?.scripts ?? 0,
    })),
  );
}
