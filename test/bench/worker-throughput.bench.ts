import { jobIdFor, JOBS_STREAM, SummaryJobQueue } from '@app/summary-queue';
import { LlmClient } from '@app/llm';
import { REDIS_CLIENT } from '@app/redis';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { Client } from 'pg';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { StreamsConsumer } from '../../apps/worker/src/consumer/streams.consumer';
import { loadWorkerConfig } from '../../apps/worker/src/worker.config';
import { WorkerModule } from '../../apps/worker/src/worker.module';

export interface WorkerBenchResult {
  readonly name: string;
  readonly jobs: number;
  readonly concurrency: number;
  readonly modelLatencyMs: number;
  readonly jobsPerSecond: number;
  readonly redisRoundTripsPerJob: number;
  readonly postgresRoundTripsPerJob: number;
}

/** A model that answers after a fixed time: the bench measures our plumbing around it. */
class FixedLatencyModel implements LlmClient {
  constructor(private readonly ms: number) {}
  async summarize(): Promise<string> {
    if (this.ms > 0) await new Promise((r) => setTimeout(r, this.ms));
    return 'A summary.';
  }
}

export async function benchWorker(redisUrl: string, databaseUrl: string): Promise<WorkerBenchResult[]> {
  const results: WorkerBenchResult[] = [];
  for (const [jobs, concurrency, latency] of [
    [2000, 16, 0],
    [640, 16, 200],
    [640, 64, 200],
  ] as const) {
    const config = loadWorkerConfig({
      REDIS_URL: redisUrl,
      DATABASE_URL: databaseUrl,
      LOG_LEVEL: 'silent',
      WORKER_CONCURRENCY: String(concurrency),
    });
    const moduleRef = await Test.createTestingModule({
      imports: [WorkerModule.forRoot(config, { autoStart: false, blockMs: 50 })],
    })
      .overrideProvider(LlmClient)
      .useValue(new FixedLatencyModel(latency))
      .compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    const redis = app.get<Redis>(REDIS_CLIENT);
    const ds = app.get(DataSource);
    await redis.flushdb();
    await ds.query('TRUNCATE summaries, outbox');
    const queue = new SummaryJobQueue(redis);
    for (let i = 0; i < jobs; i++) {
      await queue.enqueue({
        jobId: jobIdFor(`bench:POST:/v1/summaries:${randomUUID()}`),
        tenant: 'bench',
        payload: { text: 'Bench me.', notify: 'b@example.com' },
      });
    }

    // Round trips counted where they leave the process: every command of every
    // Redis connection of the worker (its blocking reader included), every
    // query TypeORM sends. Progress is polled on connections of our own.
    const poller = new Redis(redisUrl);
    const pgPoller = new Client({ connectionString: databaseUrl });
    await pgPoller.connect();
    let redisCommands = 0;
    const original = Redis.prototype.sendCommand;
    Redis.prototype.sendCommand = function (this: Redis, ...args: Parameters<Redis['sendCommand']>) {
      if (this !== poller) redisCommands++;
      return original.apply(this, args);
    };
    let queries = 0;
    const logger = ds.logger;
    const logQuery = logger.logQuery.bind(logger);
    logger.logQuery = (...args: Parameters<typeof logger.logQuery>) => {
      queries++;
      return logQuery(...args);
    };

    const consumer = app.get(StreamsConsumer);
    const t0 = performance.now();
    consumer.start();
    for (;;) {
      const { rows } = await pgPoller.query<{ n: number }>('SELECT count(*)::int AS n FROM summaries');
      if (rows[0].n >= jobs) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const seconds = (performance.now() - t0) / 1000;
    while ((await poller.xlen(JOBS_STREAM)) > 0) await new Promise((r) => setTimeout(r, 10));
    await consumer.stop();
    Redis.prototype.sendCommand = original;
    poller.disconnect();
    await pgPoller.end();
    results.push({
      name: `worker, model ${latency} ms, concurrency ${concurrency}`,
      jobs,
      concurrency,
      modelLatencyMs: latency,
      jobsPerSecond: Math.round(jobs / seconds),
      redisRoundTripsPerJob: +(redisCommands / jobs).toFixed(2),
      postgresRoundTripsPerJob: +(queries / jobs).toFixed(2),
    });
    await redis.flushdb();
    await ds.query('TRUNCATE summaries, outbox');
    await app.close();
  }
  return results;
}
