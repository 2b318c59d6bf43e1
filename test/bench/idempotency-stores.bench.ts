import { REDIS_CLIENT } from '@app/redis';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { DataSource } from 'typeorm';
import { type ApiConfig, loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp } from '../../apps/api/src/create-api-app';
import {
  countPostgresStatements,
  countRedisCommands,
  type Drive,
  drive,
  KEY,
  overRounds,
  type RoundsRow,
  type Sample,
  timed,
} from './support';

/** A summary request, answered 202 (a first request and its replay alike). */
const SUMMARY: Drive = {
  body: JSON.stringify({ text: 'Benchmarks measure; tests assert.', notify: 'bench@example.com' }),
  status: 202,
};

export type StoreName = ApiConfig['idempotencyStore'];
export type Phase = 'first request' | 'replay';

export interface StoreBenchResult extends RoundsRow {
  readonly store: StoreName;
  readonly phase: Phase;
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
 * Round trips are counted where they leave the api (countRedisCommands,
 * countPostgresStatements), only while a measured run is `counting` (not in
 * warm-ups, resets or checks). The store's LISTEN connection is outside the
 * pool and uncounted; nothing on these paths follows a stream, so it sends
 * nothing while the bench runs.
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
  countRedisCommands(side.redis, () => {
    if (side.counting) side.counts[side.counting].redis++;
  });
  countPostgresStatements(side.ds, () => {
    if (side.counting) side.counts[side.counting].postgres++;
  });
  return side;
}

/** Both stores start each round from empty: Redis db 15 flushed (job stream included), the key tables truncated. */
async function reset(side: Side): Promise<void> {
  await side.redis.flushdb();
  await side.ds.query('TRUNCATE idempotency_keys, idempotency_frames');
}

async function measure(side: Side, phase: Phase, keyFor: (i: number) => string): Promise<Sample> {
  await drive(side.url, WARMUP, CONCURRENCY, () => `warmup-${randomUUID()}`, SUMMARY);
  side.counting = phase;
  const sample = await timed(REQUESTS, () => drive(side.url, REQUESTS, CONCURRENCY, keyFor, SUMMARY));
  side.counting = undefined;
  return sample;
}

async function round(side: Side, samples: Map<string, Sample[]>): Promise<void> {
  await reset(side);
  const runId = randomUUID();
  samples.get(`${side.store}/first request`)!.push(await measure(side, 'first request', (i) => `first-${runId}-${i}`));
  const replayKey = `replay-${runId}`;
  await drive(side.url, 1, 1, () => replayKey, SUMMARY);
  // The check: the key's next request is a replay.
  await drive(side.url, 1, 1, () => replayKey, { ...SUMMARY, replayed: true });
  samples.get(`${side.store}/replay`)!.push(await measure(side, 'replay', () => replayKey));
}

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
    for (const side of sides)
      for (const phase of ['first request', 'replay']) samples.set(`${side.store}/${phase}`, []);
    for (let r = 0; r < ROUNDS; r++) {
      for (const side of r % 2 === 0 ? sides : [...sides].reverse()) await round(side, samples);
    }
    return sides.flatMap((side) =>
      (['first request', 'replay'] as const).map((phase) => {
        return {
          store: side.store,
          phase,
          rounds: ROUNDS,
          requestsPerRound: REQUESTS,
          concurrency: CONCURRENCY,
          ...overRounds(samples.get(`${side.store}/${phase}`)!),
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
