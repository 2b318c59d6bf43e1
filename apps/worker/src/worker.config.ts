import { httpServerEnv } from '@app/http';
import { commonEnv, ConfigFieldError, ConfigOf, env, parseConfig, processEnv, type Env } from '@app/config';

/** Every variable the worker reads (INTERFACE.md); the manifests are checked against it. */
export const workerEnvSchema = {
  ...commonEnv,
  ...httpServerEnv,
  healthPort: env.int('HEALTH_PORT', 3001, { min: 0, max: 65535 }),
  concurrency: env.int('WORKER_CONCURRENCY', 16, { min: 1, max: 1000 }),
  claimIdleMs: env.int('CLAIM_IDLE_MS', 30_000, { min: 100, max: 3_600_000 }),
  maxDeliveries: env.int('MAX_DELIVERIES', 5, { min: 1, max: 1000 }),
  jobBudgetMs: env.secondsAsMs('JOB_BUDGET_S', 60, { max: 3600 }),
  llmProvider: env.custom('LLM_PROVIDER', (raw, all): 'openai' | 'fake' => {
    const value = raw ?? (all.OPENAI_API_KEY?.trim() ? 'openai' : 'fake');
    if (value !== 'openai' && value !== 'fake') throw new ConfigFieldError(`must be openai or fake, got "${value}"`);
    if (value === 'openai' && !all.OPENAI_API_KEY?.trim()) throw new ConfigFieldError('is openai but OPENAI_API_KEY is unset');
    return value;
  }),
  openaiApiKey: env.optionalString('OPENAI_API_KEY'),
  openaiBaseUrl: env.optionalUrl('OPENAI_BASE_URL', ['http:', 'https:']),
  openaiModel: env.string('OPENAI_MODEL', 'gpt-4.1-mini'),
  llmCallTimeoutMs: env.secondsAsMs('LLM_CALL_TIMEOUT_S', 20, { max: 600 }),
  llmMaxAttempts: env.int('LLM_MAX_ATTEMPTS', 4, { min: 1, max: 20 }),
};

export type WorkerConfig = ConfigOf<typeof workerEnvSchema>;

/** The worker's whole configuration, validated once at boot; throws naming every bad variable. */
export function loadWorkerConfig(source: Env = processEnv()): WorkerConfig {
  return parseConfig(workerEnvSchema, source);
}
