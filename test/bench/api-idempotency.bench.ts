import { REDIS_CLIENT } from '@app/redis';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp } from '../../apps/api/src/create-api-app';

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

/** The tenant key the api benches boot with (API_KEYS `bench:<KEY>`). */
export const KEY = 'bench-0123456789abcdefghij';
const body = JSON.stringify({ text: 'Benchmarks measure; tests assert.', notify: 'bench@example.com' });

/** POSTs `total` summaries, `concurrency` at a time, each with keyFor(i); the latencies in ms, sorted. */
export async function drive(
  url: string,
  total: number,
  concurrency: number,
  keyFor: (i: number) => string,
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
        body,
      });
      await res.arrayBuffer();
      if (res.status !== 202) throw new Error(`unexpected ${res.status}`);
      latencies.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return latencies.sort((a, b) => a - b);
}

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
  const send = redis.sendCommand.bind(redis);
  redis.sendCommand = ((...args: Parameters<Redis['sendCommand']>) => {
    commands++;
    return send(...args);
  }) as Redis['sendCommand'];

  const results: BenchResult[] = [];
  const run = async (name: string, total: number, concurrency: number, keyFor: (i: number) => string) => {
    await drive(url, 200, concurrency, () => `warmup-${randomUUID()}`);
    commands = 0;
    const t0 = performance.now();
    const lat = await drive(url, total, concurrency, keyFor);
    const seconds = (performance.now() - t0) / 1000;
    results.push({
      name,
      requests: total,
      concurrency,
      perSecond: Math.round(total / seconds),
      p50Ms: +lat[Math.floor(lat.length * 0.5)].toFixed(2),
      p99Ms: +lat[Math.floor(lat.length * 0.99)].toFixed(2),
      redisRoundTripsPerRequest: +(commands / total).toFixed(2),
    });
  };

  try {
    const runId = randomUUID();
    await run('POST /v1/summaries, first request (claim, enqueue, finalise)', 3000, 16, (i) => `first-${runId}-${i}`);
    const replayKey = `replay-${runId}`;
    await drive(url, 1, 1, () => replayKey);
    await run('POST /v1/summaries, replay (one claim script)', 3000, 16, () => replayKey);
  } finally {
    await redis.flushdb();
    await app.close();
  }
  return results;
}
