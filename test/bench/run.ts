/*
 * npm run bench: the benchmarks, never part of npm test. Runs against the
 * Redis and PostgreSQL of REDIS_URL / DATABASE_URL, in Redis database 15 so a
 * developer's data in database 0 is not touched.
 */
import 'reflect-metadata';
import { benchApiIdempotency, type BenchResult } from './api-idempotency.bench';

const redisBase = (process.env.REDIS_URL ?? 'redis://127.0.0.1:6379').replace(/\/\d*$/, '');
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

function print(results: readonly BenchResult[]): void {
  console.table(
    results.map((r) => ({
      benchmark: r.name,
      requests: r.requests,
      concurrency: r.concurrency,
      'req/s': r.perSecond,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      'Redis round trips/req': r.redisRoundTripsPerRequest,
    })),
  );
}

async function main(): Promise<void> {
  console.log(`node ${process.version}, ${require('node:os').cpus().length} cpus`);
  print(await benchApiIdempotency(`${redisBase}/15`, databaseUrl));
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
