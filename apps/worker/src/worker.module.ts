import { DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { HealthModule, PostgresHealthIndicator, RedisHealthIndicator } from '@app/health';
import { CONSUMER_GROUP, SummaryQueueModule, SummaryStreams } from '@app/summary-queue';
import { LlmModule } from '@app/llm';
import { LoggingModule, MetricsModule } from '@app/observability';
import { PersistenceModule } from '@app/persistence';
import { ProblemDetailsFilter } from '@app/problem';
import { RedisModule } from '@app/redis';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import {
  JOB_HANDLER,
  monotonicClock,
  realSleep,
  RETRY_CLOCK,
  RETRY_POLICY_OPTIONS,
  RETRY_RANDOM,
  RETRY_SLEEP,
  RetryPolicy,
  type RetryPolicyOptions,
  STREAMS_CONSUMER_OPTIONS,
  StreamsConsumer,
  type StreamsConsumerOptions,
  WorkerMetrics,
} from '@app/workflows';
import { QueueGauges } from './consumer/queue.gauges';
import { SummaryJobHandler } from './jobs/summary-job.handler';
import type { WorkerConfig } from './worker.config';

/** `streams`: the layout SummaryQueueModule builds from JOB_STREAM_PARTITIONS; the consumer works every partition. */
export function consumerOptionsFrom(
  config: WorkerConfig,
  streams = new SummaryStreams(config.jobStreamPartitions),
): StreamsConsumerOptions {
  return {
    partitions: streams.partitions.map((p) => ({ index: p.index, stream: p.jobs, deadLetterStream: p.dead })),
    group: CONSUMER_GROUP,
    consumer: `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
    concurrency: config.concurrency,
    claimIdleMs: config.claimIdleMs,
    maxDeliveries: config.maxDeliveries,
    jobBudgetMs: config.jobBudgetMs,
    blockMs: 2000,
    refreshIntervalMs: Math.max(50, Math.floor(config.claimIdleMs / 3)),
    reclaimIntervalMs: Math.max(100, Math.min(Math.floor(config.claimIdleMs / 2), 5000)),
    drainTimeoutMs: config.jobBudgetMs + 1000,
    autoStart: true,
  };
}

export function retryOptionsFrom(config: WorkerConfig): RetryPolicyOptions {
  return {
    maxAttempts: config.llmMaxAttempts,
    callTimeoutMs: config.llmCallTimeoutMs,
    baseDelayMs: 500,
    maxDelayMs: 8000,
    maxRetryAfterMs: 30_000,
    minUsefulAttemptMs: 1000,
  };
}

@Module({})
export class WorkerModule {
  /** `consumer` overrides exist for tests that drive the consumer by hand. */
  static forRoot(config: WorkerConfig, consumer: Partial<StreamsConsumerOptions> = {}): DynamicModule {
    return {
      module: WorkerModule,
      imports: [
        LoggingModule.forRoot({ level: config.logLevel, app: 'worker' }),
        MetricsModule,
        RedisModule.forRoot({
          url: config.redisUrl,
          clusterNodes: config.redisClusterNodes,
          durabilityMode: config.redisDurability,
          connectionName: 'worker',
          isGlobal: true,
        }),
        PersistenceModule.forRoot({
          url: config.databaseUrl,
          applicationName: 'worker',
          poolSize: Math.min(config.concurrency + 2, 50),
        }),
        HealthModule.forRoot({ readiness: [RedisHealthIndicator, PostgresHealthIndicator] }),
        SummaryQueueModule.forRoot({ partitions: config.jobStreamPartitions, isGlobal: true }),
        LlmModule.forRoot({
          provider: config.llmProvider,
          apiKey: config.openaiApiKey,
          baseUrl: config.openaiBaseUrl,
          model: config.openaiModel,
          callTimeoutMs: config.llmCallTimeoutMs,
          gatewayUrl: config.llmGatewayUrl,
          internalApiKey: config.internalApiKey,
        }),
      ],
      providers: [
        { provide: APP_FILTER, useClass: ProblemDetailsFilter },
        {
          provide: STREAMS_CONSUMER_OPTIONS,
          inject: [SummaryStreams],
          useFactory: (streams: SummaryStreams) => ({ ...consumerOptionsFrom(config, streams), ...consumer }),
        },
        { provide: RETRY_POLICY_OPTIONS, useValue: retryOptionsFrom(config) },
        { provide: RETRY_CLOCK, useValue: monotonicClock },
        { provide: RETRY_SLEEP, useValue: realSleep },
        { provide: RETRY_RANDOM, useValue: Math.random },
        RetryPolicy,
        WorkerMetrics,
        SummaryJobHandler,
        { provide: JOB_HANDLER, useExisting: SummaryJobHandler },
        StreamsConsumer,
        QueueGauges,
      ],
      exports: [StreamsConsumer],
    };
  }
}
