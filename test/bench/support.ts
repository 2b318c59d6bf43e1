import type { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import { Client, type Pool } from 'pg';
import { freshMigratedDatabase } from '../support/databases';
import type { DataSource } from 'typeorm';

/*
 * What the api benches share: the tenant key they boot with, the loop that
 * drives a route, the figures made of its latencies, and where the api's
 * round trips are counted.
 */

/** The tenant key the api benches boot with (API_KEYS `bench:<KEY>`). */
export const KEY = 'bench-0123456789abcdefghij';

export const percentile = (sorted: readonly number[], q: number): number =>
  sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))];
export const median = (values: readonly number[]): number =>
  percentile(
    [...values].sort((a, b) => a - b),
    0.5,
  );
export const ms = (x: number): number => +x.toFixed(2);
/** The order of the sides in round `r`: each side takes each place in turn. */
export const orderOf = <T>(sides: readonly T[], r: number): T[] => sides.map((_, i) => sides[(i + r) % sides.length]);

/** What every request of a drive sends, and the answer it must get. */
export interface Drive {
  /** The JSON body, already serialised. */
  readonly body: string;
  readonly status: number;
  /** The answer must carry Idempotent-Replayed: true. */
  readonly replayed?: boolean;
}

/**
 * POSTs `total` requests to `url`, `concurrency` at a time, each with keyFor(i) as its Idempotency-Key; the latencies
 * in ms, sorted.
 */
export async function drive(
  url: string,
  total: number,
  concurrency: number,
  keyFor: (i: number) => string,
  expected: Drive,
): Promise<number[]> {
  const latencies: number[] = [];
  let next = 0;
  const worker = async () => {
    while (next < total) {
      const i = next++;
      const t0 = performance.now();
      const res = await fetch(url, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'idempotency-key': keyFor(i) },
        body: expected.body,
      });
      await res.arrayBuffer();
      if (res.status !== expected.status) throw new Error(`${url}: unexpected ${res.status}`);
      if (expected.replayed && res.headers.get('idempotent-replayed') !== 'true')
        throw new Error(`${url}: not replayed`);
      latencies.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return latencies.sort((a, b) => a - b);
}

/** One measured run: requests per second, and the p50 and p99 of its latencies in ms. */
export interface Sample {
  readonly perSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

/** Times `run` (a drive of `requests` requests, its latencies sorted) into a Sample. */
export async function timed(requests: number, run: () => Promise<number[]>): Promise<Sample> {
  const t0 = performance.now();
  const lat = await run();
  const seconds = (performance.now() - t0) / 1000;
  return { perSecond: requests / seconds, p50Ms: percentile(lat, 0.5), p99Ms: percentile(lat, 0.99) };
}

/** A figure of a bench that runs in rounds: over the rounds, and the round trips over all their measured requests. */
export interface RoundsRow {
  readonly rounds: number;
  readonly requestsPerRound: number;
  readonly concurrency: number;
  /** Medians over the rounds, and the spread of req/s over them. */
  readonly perSecond: number;
  readonly perSecondMin: number;
  readonly perSecondMax: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Commands the api's Redis client sent, over every measured request of every round. */
  readonly redisRoundTripsPerRequest: number;
  /**
   * Statements the api sent to PostgreSQL (TypeORM's and the pool's, BEGIN and COMMIT included), over every measured
   * request.
   */
  readonly postgresRoundTripsPerRequest: number;
}

/** The medians (and the req/s spread) of the rounds' samples. */
export function overRounds(
  samples: readonly Sample[],
): Pick<RoundsRow, 'perSecond' | 'perSecondMin' | 'perSecondMax' | 'p50Ms' | 'p99Ms'> {
  const perSecond = samples.map((x) => x.perSecond);
  return {
    perSecond: Math.round(median(perSecond)),
    perSecondMin: Math.round(Math.min(...perSecond)),
    perSecondMax: Math.round(Math.max(...perSecond)),
    p50Ms: ms(median(samples.map((x) => x.p50Ms))),
    p99Ms: ms(median(samples.map((x) => x.p99Ms))),
  };
}

/**
 * Calls `counted` before every command the api's Redis client sends (each one a round trip: no pipelining on these
 * paths); the returned function puts the client back.
 */
export function countRedisCommands(redis: Redis, counted: () => void): () => void {
  const send = redis.sendCommand;
  const bound = send.bind(redis);
  redis.sendCommand = (...args: Parameters<Redis['sendCommand']>) => {
    counted();
    return bound(...args);
  };
  return () => {
    redis.sendCommand = send;
  };
}

/**
 * Calls `counted` before every statement the api sends to PostgreSQL: every
 * one through TypeORM (its logger's logQuery: repositories' SQL, START
 * TRANSACTION and COMMIT) plus every `pool.query` on the DataSource's pg
 * Pool, which is how the PostgreSQL idempotency store sends its SQL (past
 * TypeORM, so its logger never sees it). The two do not overlap: TypeORM
 * checks clients out with pool.connect() and never calls pool.query. A
 * LISTEN connection outside the pool is not counted. (pg_stat_statements is
 * not preloaded on the bench's server, and pg_stat_database would count the
 * bench's own resets too.)
 */
export function countPostgresStatements(ds: DataSource, counted: () => void): void {
  const logger = ds.logger;
  const logQuery = logger.logQuery.bind(logger);
  logger.logQuery = (...args: Parameters<typeof logger.logQuery>) => {
    counted();
    return logQuery(...args);
  };
  // TypeORM's postgres driver keeps its pg Pool as `master`, the pool the store queries.
  const pool = (ds.driver as unknown as { master: Pool }).master;
  const poolQuery = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    counted();
    return poolQuery(...args);
  };
}

/** A fresh, migrated database `name` beside `databaseUrl`'s, for one bench (llmwf_bench, ...); its URL. */
export async function benchDatabaseNamed(databaseUrl: string, name: string): Promise<string> {
  const admin = new Client({ connectionString: databaseUrl });
  await admin.connect();
  try {
    return await freshMigratedDatabase(admin, databaseUrl, name, 'bench');
  } finally {
    await admin.end();
  }
}
