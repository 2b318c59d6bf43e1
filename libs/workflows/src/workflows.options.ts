import type { DynamicModule, ForwardReference, Type } from '@nestjs/common';
import type { RetryPolicyOptions } from './retry/retry-policy.tokens';
import type { StreamsConsumerOptions } from './consumer/streams-consumer.options';
import type { JobHandler } from './consumer/job-handler';
import type { QueueLayout } from './queue-layout';

/** A queue worked by a plain JobHandler of its own rather than by workflows. */
export interface JobQueue {
  readonly name: string;
  readonly group: string;
  readonly layout: QueueLayout;
  readonly handler: Type<JobHandler>;
}

/** What `WorkflowsModule.forWorker()` takes. */
export interface WorkflowsWorkerOptions {
  /** Workflow classes to provide here; `@Workflow()` providers of any other module are found too. */
  readonly workflows?: readonly Type<object>[];
  /** JOB_STREAM_PARTITIONS: each queue's partition count (every app of one system gives the same). */
  readonly partitions?: number;
  /** The consumer's settings; its queues come from the workflows found. */
  readonly consumer: Omit<StreamsConsumerOptions, 'queues'>;
  /** Each step's model calls are retried under this policy (RetryPolicy). */
  readonly retry: RetryPolicyOptions;
  /** Queues worked by plain JobHandlers, before the workflows' (the first keeps the consumer's old loop names). */
  readonly jobQueues?: readonly JobQueue[];
  /** Modules the workflows' and the engine's providers need: the one that provides LlmClient at least. */
  readonly imports?: readonly (Type<unknown> | DynamicModule | Promise<DynamicModule> | ForwardReference)[];
}

export const WORKFLOWS_WORKER_OPTIONS = 'workflows:worker-options';
