import type { DynamicModule, ForwardReference, Type } from '@nestjs/common';
import type { TenantTokenLimits } from '@app/llm';
import type { RetryPolicyOptions } from './retry/retry-policy.tokens';
import type { StreamsConsumerOptions } from './consumer/streams-consumer.options';

/** What `WorkflowsModule.forWorker()` takes. */
export interface WorkflowsWorkerOptions {
  /**
   * Workflow classes to provide here; `@Workflow()` providers of any other module are found too. Their order is
   * their queues' order for the consumer, whose first queue keeps the loop names of the days it was the only one.
   */
  readonly workflows?: readonly Type<object>[];
  /** JOB_STREAM_PARTITIONS: each queue's partition count (every app of one system gives the same). */
  readonly partitions?: number;
  /** The consumer's settings; its queues come from the workflows found. */
  readonly consumer: Omit<StreamsConsumerOptions, 'queues'>;
  /** Each step's model calls are retried under this policy (RetryPolicy). */
  readonly retry: RetryPolicyOptions;
  /**
   * TENANT_TOKEN_LIMITS, for steps whose model calls go to the provider directly: each call reserves its
   * worst case and waits for the window when it does not fit. Leave it out when the calls go through the
   * gateway (LLM_GATEWAY_URL): the gateway reserves for them, and a step waits on its 429.
   */
  readonly tokenLimits?: TenantTokenLimits;
  /** Modules the workflows' and the engine's providers need: the one that provides LlmClient at least. */
  readonly imports?: readonly (Type<unknown> | DynamicModule | Promise<DynamicModule> | ForwardReference)[];
}

export const WORKFLOWS_WORKER_OPTIONS = 'workflows:worker-options';
/** The steps' TenantTokenLimiter, or null without tokenLimits. */
export const STEP_TOKEN_LIMITER = 'workflows:step-token-limiter';
