/*
 * The worker side by side on its own:
 *   TS_NODE_TRANSPILE_ONLY=true node -r ts-node/register -r tsconfig-paths/register \
 *     test/bench/worker-side-by-side.main.ts
 * REDIS_URL (its database replaced by 13) and DATABASE_URL (a database
 * llmwf_bench_worker is made and migrated next to it, as run.ts does);
 * BENCH_APPS=ts-node runs our apps through ts-node instead of built JavaScript;
 * ROUNDS, JOBS_FAST, JOBS_SLOW and WORKER_LOG_LEVEL override the defaults.
 */
import 'reflect-metadata';
import { cpus } from 'node:os';
import { benchDatabaseNamed } from './support';
import { benchWorkerSideBySide, ourApps, printWorkerSideBySide } from './worker-side-by-side.bench';

const redisUrl = `${(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379').replace(/\/\d*$/, '')}/13`;
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const optional = (name: string): number | undefined => (process.env[name] ? Number(process.env[name]) : undefined);

// The children (processes.ts kills them on exit) must not outlive an interrupted bench.
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => process.exit(130));

async function main(): Promise<void> {
  console.log(`node ${process.version}, ${cpus().length} cpus`);
  const db = await benchDatabaseNamed(databaseUrl, 'llmwf_bench_worker');
  const apps = ourApps(process.env.BENCH_APPS === 'ts-node' ? 'ts-node' : 'js');
  console.log(`our apps: ${apps.how}`);
  const rows = await benchWorkerSideBySide(redisUrl, db, {
    apps,
    rounds: optional('ROUNDS'),
    jobsFast: optional('JOBS_FAST'),
    jobsSlow: optional('JOBS_SLOW'),
    logLevel: process.env.WORKER_LOG_LEVEL,
    onRound: (r) =>
      console.log(
        `  ${r.side} ${r.modelLatencyMs} ms round ${r.round}: ${Math.round(r.jobsPerSecond)} jobs/s, ` +
          `${Math.round(r.cpuMicrosPerJob)} µs/job` +
          (r.traffic ? `, Redis ${r.traffic.sent} sent + ${r.traffic.inScripts} in scripts (MONITOR round)` : '') +
          `, PG ${r.postgresXactsPerJob.toFixed(2)}/job, ` +
          `RSS ${(r.readyRssBytes / 2 ** 20).toFixed(0)}→${(r.peakRssBytes / 2 ** 20).toFixed(0)} MB, ` +
          `${r.doneBeforeReady} done before ready, load ${r.loadAverage}`,
      ),
  });
  printWorkerSideBySide(rows);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
