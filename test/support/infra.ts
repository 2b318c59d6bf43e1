import { dataSourceOptions } from '@app/persistence';
import { Redis } from 'ioredis';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { DataSource } from 'typeorm';

/*
 * Each jest worker gets its own Redis database and PostgreSQL database, so
 * suites in different workers run in parallel without meeting; suites in one
 * worker run one after the other and start by clearing what they use.
 *
 * What a run takes and erases (README, "Tests"): on the Redis server of
 * TEST_REDIS_URL, databases 1 + slot * 3 + (worker - 1), flushed; on the
 * PostgreSQL server of TEST_DATABASE_URL, databases llmwf_test_s<slot>_w<worker>,
 * dropped and made afresh; loopback ports from freePort() and clusterPorts().
 * Each variable falls back to REDIS_URL / DATABASE_URL, then to the local
 * default, as the benches' do.
 */

/**
 * The Redis server the tests use: TEST_REDIS_URL, else REDIS_URL, else local; any database number in it is dropped
 * (its options, `?family=6`, kept).
 */
export const BASE_REDIS_URL = redisUrlWithDatabase(
  process.env.TEST_REDIS_URL || process.env.REDIS_URL || 'redis://127.0.0.1:6379',
  undefined,
);

/** `url` on database `db` (none: the URL's own path dropped), its credentials and options as they were. */
function redisUrlWithDatabase(url: string, db: number | undefined): string {
  const parsed = new URL(url);
  parsed.pathname = db === undefined ? '' : `/${db}`;
  return parsed.toString();
}
/**
 * The PostgreSQL server the tests use, as a URL of a database on it they may connect to (not one they write):
 * TEST_DATABASE_URL, else DATABASE_URL, else local.
 */
export const BASE_DATABASE_URL =
  process.env.TEST_DATABASE_URL || process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres';

export function workerId(): number {
  return Number(process.env.JEST_WORKER_ID ?? '1');
}

/**
 * TEST_SLOT (0 to 7, default 0) lets several test runs share one machine:
 * each slot has its own Redis databases, PostgreSQL databases and ports.
 * Slots 4 to 7 reuse the Redis databases and PostgreSQL database names of
 * slots 0 to 3, so they need servers of their own (TEST_REDIS_URL,
 * TEST_DATABASE_URL); their ports are their own.
 */
export function testSlot(): number {
  const slot = Number(process.env.TEST_SLOT ?? '0');
  if (!Number.isInteger(slot) || slot < 0 || slot > 7) throw new Error('TEST_SLOT must be 0 to 7');
  return slot;
}

/**
 * Redis databases 1 to 12, three a slot (jest runs at most two workers, package.json; a third is spare); 13 to 15
 * are the benches'.
 */
export function testRedisUrl(): string {
  const worker = workerId();
  if (worker > 3) throw new Error(`jest worker ${worker}: the test slots have Redis databases for three workers`);
  return redisUrlWithDatabase(BASE_REDIS_URL, 1 + (testSlot() % 4) * 3 + (worker - 1));
}

export function testDatabaseName(id = workerId()): string {
  return `llmwf_test_s${testSlot() % 4}_w${id}`;
}

export function testDatabaseUrl(): string {
  const url = new URL(BASE_DATABASE_URL);
  url.pathname = `/${testDatabaseName()}`;
  return url.toString();
}

/** A client on this worker's database, emptied. */
export async function freshRedis(): Promise<Redis> {
  const redis = new Redis(testRedisUrl(), { lazyConnect: true });
  await redis.connect();
  await redis.flushdb();
  return redis;
}

/** A port nobody else in this run uses: one block per jest worker. */
export function freePort(offset: number): number {
  return 17000 + testSlot() * 1000 + workerId() * 100 + offset;
}

export interface RedisServer {
  readonly url: string;
  readonly port: number;
  stop(): Promise<void>;
}

/** An extra redis-server on a loopback port, for tests that take Redis away. */
export async function startRedisServer(port: number): Promise<RedisServer> {
  const child: ChildProcess = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no'],
    { stdio: 'ignore' },
  );
  const url = `redis://127.0.0.1:${port}`;
  let exited = false;
  child.once('exit', () => (exited = true));
  const probe = new Redis(url, { lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
  probe.on('error', () => undefined);
  try {
    for (let i = 0; ; i++) {
      // A server that exits at once could not bind: the port is taken.
      if (exited) throw new Error(`redis-server on port ${port} exited at start (port in use?)`);
      try {
        if (probe.status !== 'ready') await probe.connect();
        await probe.ping();
        break;
      } catch (err) {
        if (i > 100) throw err;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    // Our child must be the one answering.
    const info = await probe.info('server');
    if (!info.includes(`process_id:${child.pid}`)) throw new Error(`port ${port} is served by another redis-server`);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  } finally {
    probe.disconnect();
  }
  return {
    url,
    port,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGKILL');
      await once(child, 'exit');
    },
  };
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls until `check` returns a value that is not undefined, or fails after `timeoutMs`. */
export async function eventually<T>(
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 5000,
  what = 'condition',
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

/** A DataSource on this worker's migrated database. */
export async function testDataSource(): Promise<DataSource> {
  const ds = new DataSource(dataSourceOptions({ url: testDatabaseUrl(), applicationName: 'test' }));
  await ds.initialize();
  return ds;
}

export async function truncateAll(ds: DataSource): Promise<void> {
  await ds.query('TRUNCATE summaries, outbox, workflow_runs, workflow_steps RESTART IDENTITY');
}
