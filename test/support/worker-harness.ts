import type { DynamicModule, INestApplication, Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { REDIS_CLIENT } from '@app/redis';
import type { Redis } from 'ioredis';
import type { DataSource } from 'typeorm';
import { DataSource as DataSourceToken } from 'typeorm';
import { StreamsConsumer } from '../../libs/workflows/src/consumer/streams.consumer';
import type { StreamsConsumerOptions } from '../../libs/workflows/src/consumer/streams-consumer.options';
import { STREAM_TAG_PREFIX, SummaryStreams, type SummaryJob } from '@app/summary-queue';
import { entryFieldMap, type JobHandler, type JobRunContext, stepEntryFields, WorkflowHandler } from '@app/workflows';
import { loadWorkerConfig } from '../../apps/worker/src/worker.config';
import { WorkerModule } from '../../apps/worker/src/worker.module';
import { testDatabaseUrl, testRedisUrl } from './infra';

/**
 * A summary job's delivery as the worker runs it, for tests that play a worker
 * the consumer does not drive (one that dies before its ack): `handle` runs
 * the job's step to its commit without the ack; `deadLettered` is the
 * consumer's dead-letter hook (a test may replace it to inject a fault).
 */
export interface SummaryJobDriver {
  handle(job: SummaryJob, ctx: Pick<JobRunContext, 'deadline' | 'stopRetrying' | 'signal'>): Promise<string>;
  deadLettered: JobHandler['deadLettered'];
}

export interface WorkerHarness {
  readonly app: INestApplication;
  readonly consumer: StreamsConsumer;
  readonly handler: SummaryJobDriver;
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
  /** Modules beside the worker's (a test's own workflows, found by the explorer as the worker's are). */
  imports?: readonly (Type<unknown> | DynamicModule)[];
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
    imports: [WorkerModule.forRoot(config, { autoStart: false, ...options.consumer }), ...(options.imports ?? [])],
  }).compile();
  const app = moduleRef.createNestApplication({ bufferLogs: true });
  app.useLogger(false);
  await app.init();
  return {
    app,
    consumer: app.get(StreamsConsumer),
    handler: summaryJobDriver(app.get(WorkflowHandler), config.jobStreamPartitions),
    redis: app.get<Redis>(REDIS_CLIENT),
    dataSource: app.get(DataSourceToken),
    close: () => app.close(),
  };
}

function summaryJobDriver(handler: WorkflowHandler, partitions: number): SummaryJobDriver {
  const streams = new SummaryStreams(partitions);
  return {
    handle: async (job, ctx) => {
      const fields = entryFieldMap(
        stepEntryFields({ runId: job.jobId, tenant: job.tenant, payload: JSON.stringify(job.payload) }),
      );
      const source = { queue: STREAM_TAG_PREFIX, partition: streams.of(job.jobId).index };
      const result = await handler.process({ id: '0-1', fields }, { ...ctx, source, delivery: 1 });
      return result.outcome;
    },
    get deadLettered() {
      return handler.deadLettered;
    },
    set deadLettered(hook) {
      // The consumer calls the handler's own property at dead-letter time: an override there takes effect.
      (handler as { deadLettered: JobHandler['deadLettered'] }).deadLettered = hook;
    },
  };
}
