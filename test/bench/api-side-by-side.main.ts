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
import { Client } from 'pg';
import { dataSourceOptions } from '@app/persistence';
import { DataSource } from 'typeorm';
import { benchApiSideBySide, printApiSideBySide } from './api-side-by-side.bench';

const redisBase = (process.env.REDIS_URL ?? 'redis://127.0.0.1:6379').replace(/\/\d*$/, '');
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DATABASE = 'llmwf_bench_api';

async function benchDatabase(): Promise<string> {
  const admin = new Client({ connectionString: databaseUrl });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${DATABASE}`);
  await admin.end();
  const url = new URL(databaseUrl);
  url.pathname = `/${DATABASE}`;
  const ds = new DataSource(dataSourceOptions({ url: url.toString(), applicationName: 'bench' }));
  await ds.initialize();
  await ds.runMigrations();
  await ds.destroy();
  return url.toString();
}

async function main(): Promise<void> {
  console.log(`node ${process.version}, ${cpus().length} cpus`);
  printApiSideBySide(await benchApiSideBySide(`${redisBase}/14`, await benchDatabase()));
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
