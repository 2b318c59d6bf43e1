import { DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { HealthModule, PostgresHealthIndicator, RedisHealthIndicator } from '@app/health';
import { SummaryQueueModule } from '@app/summary-queue';
import { LlmModule } from '@app/llm';
import { LoggingModule, MetricsModule } from '@app/observability';
import { TracingModule } from '@app/tracing';
import { PersistenceModule } from '@app/persistence';
import { ProblemDetailsFilter } from '@app/problem';
import { RedisModule } from '@app/redis';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import {
  type RetryPolicyOptions,
  type StreamsConsumerOptions,
  workflowRunRetentionProviders,
  WorkflowsModule,
} from '@app/workflows';
import { QueueGauges } from './consumer/queue.gauges';
import { SummariesWorkflow } from './workflows/summaries.workflow';
import { TriageWorkflow } from './workflows/triage.workflow';
import type { WorkerConfig } from './worker.config';

/** The consumer's settings; its queues are the workflows' (and summaries'), every partition of each. */
export function consumerOptionsFrom(config: WorkerConfig): Omit<StreamsConsumerOptions, 'queues'> {
  return {
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
        TracingModule,
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
        WorkflowsModule.forWorker({
          // Summaries first: its queue's consumer loops keep the names they had before workflows.
          workflows: [SummariesWorkflow, TriageWorkflow],
          partitions: config.jobStreamPartitions,
          consumer: { ...consumerOptionsFrom(config), ...consumer },
          retry: retryOptionsFrom(config),
          // Unset in gateway mode (the config reads it only for direct calls): the gateway reserves then.
          ...(config.tenantTokenLimits ? { tokenLimits: config.tenantTokenLimits } : {}),
          imports: [
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
        }),
      ],
      providers: [
        { provide: APP_FILTER, useClass: ProblemDetailsFilter },
        QueueGauges,
        ...workflowRunRetentionProviders({ retentionDays: config.workflowRunRetentionDays }),
      ],
      exports: [WorkflowsModule],
    };
  }
}
