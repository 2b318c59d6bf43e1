import { REDIS_CLIENT } from '@app/redis';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Pool } from 'pg';
import { DataSource } from 'typeorm';
import { type ApiConfig, loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp } from '../../apps/api/src/create-api-app';
import { drive, KEY } from './api-idempotency.bench';

export type StoreName = ApiConfig['idempotencyStore'];
export type Phase = 'first request' | 'replay';

export interface StoreBenchResult {
  readonly store: StoreName;
  readonly phase: Phase;
  readonly rounds: number;
  readonly requestsPerRound: number;
  readonly concurrency: number;
  /** Medians over the rounds. */
  readonly perSecond: number;
  readonly perSecondMin: number;
  readonly perSecondMax: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Commands the api's Redis client sent, over every measured request of every round. */
  readonly redisRoundTripsPerRequest: number;
  /** Statements the api sent to PostgreSQL (TypeORM's and the pool's), over every measured request. */
  readonly postgresRoundTripsPerRequest: number;
}

const ROUNDS = 5;
const REQUESTS = 2000;
const CONCURRENCY = 16; // as benchApiIdempotency
const WARMUP = 200;

interface Side {
  readonly store: StoreName;
  readonly app: NestExpressApplication;
  readonly url: string;
  readonly redis: Redis;
  readonly ds: DataSource;
  /** The phase whose round trips are being counted, if any. */
  counting: Phase | undefined;
  readonly counts: Record<Phase, { redis: number; postgres: number }>;
}

/*
 * Round trips are counted where they leave the api, only while a measured
 * run is `counting` (not in warm-ups, resets or checks).
 * Redis: every command of the api's client (as benchApiIdempotency does).
 * PostgreSQL: every statement through TypeORM (its logger's logQuery, as
 * benchWorker counts them) plus every `pool.query` on the DataSource's pg
 * Pool, which is how the PostgreSQL store sends its SQL (past TypeORM, so its
 * logger never sees it). The two do not overlap: TypeORM checks clients out
 * with pool.connect() and never calls pool.query. The store's LISTEN
 * connection is outside the pool and uncounted; nothing on these paths
 * follows a stream, so it sends nothing while the bench runs.
 */
async function boot(store: StoreName, redisUrl: string, databaseUrl: string): Promise<Side> {
  const config = loadApiConfig({
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    API_KEYS: `bench:${KEY}`,
    IDEMPOTENCY_STORE: store,
  });
  const app = (await createApiApp(ApiModule.forRoot(config))) as NestExpressApplication;
  await app.listen(0, '127.0.0.1');
  const side: Side = {
    store,
    app,
    url: `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}/v1/summaries`,
    redis: app.get<Redis>(REDIS_CLIENT),
    ds: app.get(DataSource),
    counting: undefined,
    counts: { 'first request': { redis: 0, postgres: 0 }, replay: { redis: 0, postgres: 0 } },
  };
  const send = side.redis.sendCommand.bind(side.redis);
  side.redis.sendCommand = ((...args: Parameters<Redis['sendCommand']>) => {
    if (side.counting) side.counts[side.counting].redis++;
    return send(...args);
  }) as Redis['sendCommand'];
  const logger = side.ds.logger;
  const logQuery = logger.logQuery.bind(logger);
  logger.logQuery = (...args: Parameters<typeof logger.logQuery>) => {
    if (side.counting) side.counts[side.counting].postgres++;
    return logQuery(...args);
  };
  // TypeORM's postgres driver keeps its pg Pool as `master`, the pool the store queries.
  const pool = (side.ds.driver as unknown as { master: Pool }).master;
  const poolQuery = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    if (side.counting) side.counts[side.counting].postgres++;
    return poolQuery(...args);
  };
  return side;
}

/** Both stores start each round from empty: Redis db 15 flushed (job stream included), the key tables truncated. */
async function reset(side: Side): Promise<void> {
  await side.redis.flushdb();
  await side.ds.query('TRUNCATE idempotency_keys, idempotency_frames');
}

interface Sample {
  readonly perSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

async function measure(side: Side, phase: Phase, keyFor: (i: number) => string): Promise<Sample> {
  await drive(side.url, WARMUP, CONCURRENCY, () => `warmup-${randomUUID()}`);
  side.counting = phase;
  const t0 = performance.now();
  const lat = await drive(side.url, REQUESTS, CONCURRENCY, keyFor);
  const seconds = (performance.now() - t0) / 1000;
  side.counting = undefined;
  return {
    perSecond: REQUESTS / seconds,
    p50Ms: lat[Math.floor(lat.length * 0.5)],
    p99Ms: lat[Math.floor(lat.length * 0.99)],
  };
}

async function round(side: Side, samples: Map<string, Sample[]>): Promise<void> {
  await reset(side);
  const runId = randomUUID();
  samples.get(`${side.store}/first request`)!.push(await measure(side, 'first request', (i) => `first-${runId}-${i}`));
  const replayKey = `replay-${runId}`;
  await drive(side.url, 1, 1, () => replayKey);
  const check = await fetch(side.url, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'idempotency-key': replayKey },
    body: JSON.stringify({ text: 'Benchmarks measure; tests assert.', notify: 'bench@example.com' }),
  });
  await check.arrayBuffer();
  if (check.headers.get('idempotent-replayed') !== 'true') throw new Error(`${side.store}: the replay was not replayed`);
  samples.get(`${side.store}/replay`)!.push(await measure(side, 'replay', () => replayKey));
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/**
 * POST /v1/summaries, first request and replay, on an api with
 * IDEMPOTENCY_STORE=redis and one with =postgres, both up at once; rounds
 * alternate which store goes first, and each figure is the median of its
 * rounds.
 */
export async function benchIdempotencyStores(redisUrl: string, databaseUrl: string): Promise<StoreBenchResult[]> {
  const sides: Side[] = [];
  try {
    sides.push(await boot('redis', redisUrl, databaseUrl));
    sides.push(await boot('postgres', redisUrl, databaseUrl));
    const samples = new Map<string, Sample[]>();
    for (const side of sides) for (const phase of ['first request', 'replay']) samples.set(`${side.store}/${phase}`, []);
    for (let r = 0; r < ROUNDS; r++) {
      for (const side of r % 2 === 0 ? sides : [...sides].reverse()) await round(side, samples);
    }
    return sides.flatMap((side) =>
      (['first request', 'replay'] as const).map((phase) => {
        const s = samples.get(`${side.store}/${phase}`)!;
        const perSecond = s.map((x) => x.perSecond);
        return {
          store: side.store,
          phase,
          rounds: ROUNDS,
          requestsPerRound: REQUESTS,
          concurrency: CONCURRENCY,
          perSecond: Math.round(median(perSecond)),
          perSecondMin: Math.round(Math.min(...perSecond)),
          perSecondMax: Math.round(Math.max(...perSecond)),
          p50Ms: +median(s.map((x) => x.p50Ms)).toFixed(2),
          p99Ms: +median(s.map((x) => x.p99Ms)).toFixed(2),
          redisRoundTripsPerRequest: +(side.counts[phase].redis / (ROUNDS * REQUESTS)).toFixed(2),
          postgresRoundTripsPerRequest: +(side.counts[phase].postgres / (ROUNDS * REQUESTS)).toFixed(2),
        };
      }),
    );
  } finally {
    for (const side of sides) {
      await reset(side).catch(() => undefined);
      await side.app.close();
    }
  }
}
