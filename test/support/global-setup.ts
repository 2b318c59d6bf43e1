// Jest's moduleNameMapper does not apply to globalSetup: resolve the @app/* aliases here.
import 'tsconfig-paths/register';
import type { Config } from '@jest/types';
import { Redis } from 'ioredis';
import { Client } from 'pg';
import { join } from 'node:path';
import { buildAppsUnlessCurrent } from './app-builds';
import { freshMigratedDatabase } from './databases';
import { BASE_DATABASE_URL, BASE_REDIS_URL, testDatabaseName } from './infra';

const ROOT = join(__dirname, '..', '..');

/**
 * Checks that Redis and PostgreSQL answer, gives every jest worker a fresh
 * PostgreSQL database with the migrations applied (the same migrations
 * production runs, never `synchronize`), and builds the apps once for the
 * suites that run them as processes (dist/apps/<app>/main.js): built per
 * suite, two jest workers could write one bundle at once. Not again when the
 * last run built them from the same sources (app-builds.ts).
 */
export default async function globalSetup(globalConfig: Config.GlobalConfig): Promise<void> {
  const redis = new Redis(BASE_REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  try {
    await redis.connect();
    await redis.ping();
  } catch (err) {
    throw new Error(`Tests need Redis at ${BASE_REDIS_URL}: ${(err as Error).message}`, { cause: err });
  } finally {
    redis.disconnect();
  }

  const admin = new Client({ connectionString: BASE_DATABASE_URL });
  try {
    await admin.connect();
  } catch (err) {
    throw new Error(`Tests need PostgreSQL at ${BASE_DATABASE_URL}: ${(err as Error).message}`, { cause: err });
  }
  const workers = Math.max(1, globalConfig.maxWorkers);
  try {
    for (let id = 1; id <= workers; id++)
      await freshMigratedDatabase(admin, BASE_DATABASE_URL, testDatabaseName(id), 'test-setup');
  } finally {
    await admin.end();
  }
  if (buildAppsUnlessCurrent(ROOT, ['api', 'worker', 'relay', 'admin']) === 'current') {
    process.stderr.write('\ndist/apps: built from these very sources by the last run, not built again\n');
  }
}
