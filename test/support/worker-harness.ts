import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { REDIS_CLIENT } from '@app/redis';
import type { Redis } from 'ioredis';
import type { DataSource } from 'typeorm';
import { DataSource as DataSourceToken } from 'typeorm';
import { StreamsConsumer } from '../../libs/workflows/src/consumer/streams.consumer';
import type { StreamsConsumerOptions } from '../../libs/workflows/src/consumer/streams-consumer.options';
import { SummaryJobHandler } from '../../apps/worker/src/jobs/summary-job.handler';
import { loadWorkerConfig } from '../../apps/worker/src/worker.config';
import { WorkerModule } from '../../apps/worker/src/worker.module';
import { testDatabaseUrl, testRedisUrl } from './infra';

export interface WorkerHarness {
  readonly app: INestApplication;
  readonly consumer: StreamsConsumer;
  readonly handler: SummaryJobHandler;
  readonly redis: Redis;
  readonly dataSource: DataSource;
  close(): Promise<void>;
}

/**
 * The worker as main.ts builds it, on this worker's Redis and PostgreSQL,
 * with the real openai SDK pointed at `modelUrl` (a FakeOpenAiServer).
 * The loop does not start unless `autoStart` is set: tests drive runOnce().
 */
export async function startWorker(options: {
  modelUrl: string;
  env?: Record<string, string>;
  consumer?: Partial<StreamsConsumerOptions>;
}): Promise<WorkerHarness> {
  const config = loadWorkerConfig({
    REDIS_URL: testRedisUrl(),
    DATABASE_URL: testDatabaseUrl(),
    LOG_LEVEL: 'silent',
    LLM_PROVIDER: 'openai',
    OPENAI_API_KEY: 'test-key',
    OPENAI_BASE_URL: options.modelUrl,
    ...options.env,
  });
  const moduleRef = await Test.createTestingModule({
    imports: [WorkerModule.forRoot(config, { autoStart: false, ...options.consumer })],
  }).compile();
  const app = moduleRef.createNestApplication({ bufferLogs: true });
  app.useLogger(false);
  await app.init();
  return {
    app,
    consumer: app.get(StreamsConsumer),
    handler: app.get(SummaryJobHandler),
    redis: app.get<Redis>(REDIS_CLIENT),
    dataSource: app.get(DataSourceToken),
    close: () => app.close(),
  };
}
