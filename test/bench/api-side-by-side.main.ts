/*
 * The api side-by-side bench alone:
 *   TS_NODE_TRANSPILE_ONLY=true node -r ts-node/register -r tsconfig-paths/register test/bench/api-side-by-side.main.ts
 * In Redis database 14 of REDIS_URL and a database of its own
 * (llmwf_bench_api, made afresh and migrated here, as run.ts makes
 * llmwf_bench). SIDE_BY_SIDE_ROUNDS and SIDE_BY_SIDE_SECONDS change the
 * rounds (5) and their length (5 s).
 */
import 'reflect-metadata';
import { cpus } from 'node:os';
import { benchApiSideBySide, printApiSideBySide } from './api-side-by-side.bench';
import { benchDatabaseNamed } from './support';

const redisBase = (process.env.REDIS_URL ?? 'redis://127.0.0.1:6379').replace(/\/\d*$/, '');
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DATABASE = 'llmwf_bench_api';

async function main(): Promise<void> {
  console.log(`node ${process.version}, ${cpus().length} cpus`);
  printApiSideBySide(await benchApiSideBySide(`${redisBase}/14`, await benchDatabaseNamed(databaseUrl, DATABASE)));
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
