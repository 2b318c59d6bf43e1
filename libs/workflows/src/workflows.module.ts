import { type DynamicModule, Module, type Provider } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { TenantTokenLimiter } from '@app/llm';
import { REDIS_CLIENT, type RedisClient } from '@app/redis';
import { STEP_TOKEN_LIMITER } from './workflows.options';
import { JOB_HANDLER } from './consumer/job-handler';
import { STREAMS_CONSUMER_OPTIONS, type StreamsConsumerOptions } from './consumer/streams-consumer.options';
import { StreamsConsumer } from './consumer/streams.consumer';
import { RetryPolicy } from './retry/retry-policy.service';
import {
  monotonicClock,
  realSleep,
  RETRY_CLOCK,
  RETRY_POLICY_OPTIONS,
  RETRY_RANDOM,
  RETRY_SLEEP,
} from './retry/retry-policy.tokens';
import { WorkerMetrics } from './worker.metrics';
import { WorkflowMetrics } from './workflow.metrics';
import { WorkflowHandler } from './workflow.handler';
import { WorkflowRegistry } from './workflow.registry';
import { WorkflowStore } from './workflow-store';
import { WorkflowClientModule } from './client/workflow-client.module';
import { WorkflowsExplorer } from './workflows.explorer';
import { WORKFLOWS_WORKER_OPTIONS, type WorkflowsWorkerOptions } from './workflows.options';

/**
 * The workflow engine, in the shape of @nestjs/bullmq's BullModule: the
 * worker imports `forWorker()` once and lists its workflow classes (or
 * provides them in any module: the explorer finds every `@Workflow()`
 * provider). It brings the consumer (one over every queue the workflows
 * name), the retry policy, the store and the handler. Needs the global
 * RedisModule, PersistenceModule, HealthModule, MetricsModule and
 * LoggingModule, and `imports` giving LlmClient. Written by hand rather than
 * with ConfigurableModuleBuilder, which makes one pair of static methods per
 * class, where this module has one for each side (worker, client).
 */
@Module({})
export class WorkflowsModule {
  /**
   * The api's side: the client that starts runs and reads them, and one
   * `@InjectWorkflow(name)` handle per workflow listed (WorkflowClientModule).
   */
  static forClient(options: Parameters<typeof WorkflowClientModule.forClient>[0]): DynamicModule {
    return WorkflowClientModule.forClient(options);
  }

  static forWorker(options: WorkflowsWorkerOptions): DynamicModule {
    const providers: Provider[] = [
      { provide: WORKFLOWS_WORKER_OPTIONS, useValue: options },
      WorkflowsExplorer,
      { provide: WorkflowRegistry, inject: [WorkflowsExplorer], useFactory: (e: WorkflowsExplorer) => e.explore() },
      {
        provide: STREAMS_CONSUMER_OPTIONS,
        inject: [WorkflowRegistry],
        useFactory: (registry: WorkflowRegistry): StreamsConsumerOptions => ({
          ...options.consumer,
          queues: registry.queues.map((q) => ({
            name: q.name,
            group: q.group,
            partitions: q.layout.partitions.map((p) => ({ index: p.index, stream: p.jobs, deadLetterStream: p.dead })),
          })),
        }),
      },
      { provide: RETRY_POLICY_OPTIONS, useValue: options.retry },
      { provide: RETRY_CLOCK, useValue: monotonicClock },
      { provide: RETRY_SLEEP, useValue: realSleep },
      { provide: RETRY_RANDOM, useValue: Math.random },
      RetryPolicy,
      {
        provide: STEP_TOKEN_LIMITER,
        inject: [REDIS_CLIENT],
        // A reservation outlives the longest delivery (JOB_BUDGET_S) a little: a worker killed mid-call frees it then.
        useFactory: (redis: RedisClient) =>
          options.tokenLimits
            ? new TenantTokenLimiter(redis, options.tokenLimits, options.consumer.jobBudgetMs + 5000)
            : null,
      },
      WorkerMetrics,
      WorkflowMetrics,
      WorkflowStore,
      WorkflowHandler,
      { provide: JOB_HANDLER, useExisting: WorkflowHandler },
      StreamsConsumer,
      ...(options.workflows ?? []),
    ];
    return {
      module: WorkflowsModule,
      imports: [DiscoveryModule, ...(options.imports ?? [])],
      providers,
      exports: [
        StreamsConsumer,
        WorkflowRegistry,
        WorkflowStore,
        WorkflowHandler,
        RetryPolicy,
        WorkerMetrics,
        WorkflowMetrics,
        JOB_HANDLER,
      ],
    };
  }
}
