import { httpServerEnv } from '@app/http';
import { tracingEnv } from '@app/tracing';
import {
  commonEnv,
  ConfigFieldError,
  redisDurabilityEnv,
  ConfigOf,
  env,
  type EnvField,
  parseConfig,
  processEnv,
  type Env,
} from '@app/config';
import {
  internalApiKeyEnv,
  llmGatewayEnv,
  llmProviderUnlessGatewayEnv,
  tenantTokenLimitsUnlessGatewayEnv,
} from '@app/llm';
import { jobStreamPartitionsEnv } from '@app/summary-queue';
import { JOB_RECORD_TTL_MS } from '@app/workflows';

const RUN_RECORD_DAYS = JOB_RECORD_TTL_MS / 86_400_000;

/** Every variable the worker reads (INTERFACE.md); the manifests are checked against it. */
export const workerEnvSchema = {
  ...commonEnv,
  ...redisDurabilityEnv,
  ...httpServerEnv,
  ...tracingEnv,
  healthPort: env.int('HEALTH_PORT', 3001, { min: 0, max: 65535 }, { describe: 'health and metrics' }),
  concurrency: env.int(
    'WORKER_CONCURRENCY',
    16,
    { min: 1, max: 1000 },
    { describe: 'steps running per process (as many more may be committing)' },
  ),
  claimIdleMs: env.int(
    'CLAIM_IDLE_MS',
    30_000,
    { min: 100, max: 3_600_000 },
    { describe: 'a live worker refreshes its entries every third of this' },
  ),
  ...jobStreamPartitionsEnv,
  maxDeliveries: env.int('MAX_DELIVERIES', 5, { min: 1, max: 1000 }),
  jobBudgetMs: env.secondsAsMs(
    'JOB_BUDGET_S',
    60,
    { max: 3600 },
    { describe: "one delivery's deadline; fractions allowed" },
  ),
  // With LLM_GATEWAY_URL, LLM_PROVIDER and OPENAI_API_KEY / OPENAI_BASE_URL are not read: the api holds the provider.
  ...llmProviderUnlessGatewayEnv,
  ...tenantTokenLimitsUnlessGatewayEnv,
  ...internalApiKeyEnv,
  ...llmGatewayEnv,
  llmCallTimeoutMs: env.secondsAsMs(
    'LLM_CALL_TIMEOUT_S',
    20,
    { max: 600 },
    { describe: 'hard limit of one attempt; fractions allowed' },
  ),
  llmMaxAttempts: env.int('LLM_MAX_ATTEMPTS', 4, { min: 1, max: 20 }, { describe: 'total attempts per delivery' }),
  workflowRunRetentionDays: atLeastTheRecordsLife(
    env.int(
      'WORKFLOW_RUN_RETENTION_DAYS',
      30,
      { min: 0, max: 3650 },
      {
        describe:
          'finished workflow runs older than this are deleted with their steps; 0 keeps them for ever; else at ' +
          `least ${RUN_RECORD_DAYS + 1}, so a run's Redis record (kept ${RUN_RECORD_DAYS} days) is gone before its ` +
          'row: GET /v1/runs never reads a finished run as queued again',
      },
    ),
  ),
};

export type WorkerConfig = ConfigOf<typeof workerEnvSchema>;

/**
 * A run's Redis record (tenant, accepted, failed) outlives its start by
 * JOB_RECORD_TTL_MS; a run whose row is gone while its record lives reads
 * as queued. Retention shorter than the record's life would show finished
 * runs as queued again, and their key replays, so they could never start anew.
 */
function atLeastTheRecordsLife(field: EnvField<number>): EnvField<number> {
  return {
    ...field,
    parse: (raw, source) => {
      const days = field.parse(raw, source);
      if (days !== 0 && days <= RUN_RECORD_DAYS)
        throw new ConfigFieldError(`must be 0 (keep for ever) or more than ${RUN_RECORD_DAYS} days, got ${days}`);
      return days;
    },
  };
}

/** The worker's whole configuration, validated once at boot; throws naming every bad variable. */
export function loadWorkerConfig(source: Env = processEnv()): WorkerConfig {
  return parseConfig(workerEnvSchema, source);
}
