import { REDIS_CLIENT } from '@app/redis';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp } from '../../apps/api/src/create-api-app';
import { countRedisCommands, type Drive, drive, KEY, ms, timed } from './support';

export interface BenchResult {
  readonly name: string;
  readonly requests: number;
  readonly concurrency: number;
  readonly perSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Commands the api's Redis client sent per request: each one a round trip (no pipelining on these paths). */
  readonly redisRoundTripsPerRequest: number;
}

/** A summary request, answered 202 (a first request and its replay alike). */
export const SUMMARY: Drive = {
  body: JSON.stringify({ text: 'Benchmarks measure; tests assert.', notify: 'bench@example.com' }),
  status: 202,
};

export async function benchApiIdempotency(redisUrl: string, databaseUrl: string): Promise<BenchResult[]> {
  const config = loadApiConfig({
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    API_KEYS: `bench:${KEY}`,
  });
  const app = (await createApiApp(ApiModule.forRoot(config))) as NestExpressApplication;
  await app.listen(0, '127.0.0.1');
  const url = `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}/v1/summaries`;
  const redis = app.get<Redis>(REDIS_CLIENT);
  await redis.flushdb();

  let commands = 0;
  countRedisCommands(redis, () => commands++);

  const results: BenchResult[] = [];
  const run = async (name: string, total: number, concurrency: number, keyFor: (i: number) => string) => {
    await drive(url, 200, concurrency, () => `warmup-${randomUUID()}`, SUMMARY);
    commands = 0;
    const sample = await timed(total, () => drive(url, total, concurrency, keyFor, SUMMARY));
    results.push({
      name,
      requests: total,
      concurrency,
      perSecond: Math.round(sample.perSecond),
      p50Ms: ms(sample.p50Ms),
      p99Ms: ms(sample.p99Ms),
      redisRoundTripsPerRequest: +(commands / total).toFixed(2),
    });
  };

  try {
    const runId = randomUUID();
    await run('POST /v1/summaries, first request (claim, enqueue, finalise)', 3000, 16, (i) => `first-${runId}-${i}`);
    const replayKey = `replay-${runId}`;
    await drive(url, 1, 1, () => replayKey, SUMMARY);
    await run('POST /v1/summaries, replay (one claim script)', 3000, 16, () => replayKey);
  } finally {
    await redis.flushdb();
    await app.close();
  }
  return results;
}
