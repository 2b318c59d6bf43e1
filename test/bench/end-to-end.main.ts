/*
 * The end-to-end bench on its own:
 *   TS_NODE_TRANSPILE_ONLY=true node -r ts-node/register -r tsconfig-paths/register test/bench/end-to-end.main.ts
 * REDIS_URL (its database replaced by 13) and DATABASE_URL (a database
 * llmwf_bench_worker is made and migrated next to it, as run.ts does);
 * BENCH_APPS=ts-node runs our apps through ts-node instead of built JavaScript;
 * RATES (e.g. 200,400), SECONDS, ROUNDS and E2E_LOG_LEVEL override the defaults.
 */
import 'reflect-metadata';
import { cpus } from 'node:os';
import { benchEndToEnd, printEndToEnd } from './end-to-end.bench';
import { benchDatabaseNamed } from './support';
import { ourApps } from './worker-side-by-side.bench';

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
  printEndToEnd(
    await benchEndToEnd(redisUrl, db, {
      apps,
      rates: process.env.RATES ? process.env.RATES.split(',').map(Number) : undefined,
      seconds: optional('SECONDS'),
      rounds: optional('ROUNDS'),
      logLevel: process.env.E2E_LOG_LEVEL,
    }),
  );
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
