import { configProblems } from '@app/config';
import { loadWorkerConfig } from './worker.config';

const problemsOf = (env: Record<string, string>) => configProblems(loadWorkerConfig, env);

describe('worker configuration', () => {
  it('has the documented defaults, the fake model without an API key', () => {
    expect(loadWorkerConfig({})).toMatchObject({
      healthPort: 3001,
      concurrency: 16,
      claimIdleMs: 30_000,
      maxDeliveries: 5,
      jobBudgetMs: 60_000,
      llmProvider: 'fake',
      openaiModel: 'gpt-4.1-mini',
      llmCallTimeoutMs: 20_000,
      llmMaxAttempts: 4,
      jobStreamPartitions: 1,
      workflowRunRetentionDays: 30,
    });
  });

  it('keeps finished workflow runs for ever with WORKFLOW_RUN_RETENTION_DAYS=0', () => {
    expect(loadWorkerConfig({ WORKFLOW_RUN_RETENTION_DAYS: '0' }).workflowRunRetentionDays).toBe(0);
  });

  it('uses openai when OPENAI_API_KEY is set', () => {
    expect(loadWorkerConfig({ OPENAI_API_KEY: 'sk-x' }).llmProvider).toBe('openai');
  });

  it('accepts fractional seconds', () => {
    expect(loadWorkerConfig({ LLM_CALL_TIMEOUT_S: '0.2', JOB_BUDGET_S: '0.5' })).toMatchObject({
      llmCallTimeoutMs: 200,
      jobBudgetMs: 500,
    });
  });

  it.each([
    ['WORKER_CONCURRENCY', '0'],
    ['WORKER_CONCURRENCY', 'many'],
    ['CLAIM_IDLE_MS', '5s'],
    ['MAX_DELIVERIES', '-2'],
    ['JOB_BUDGET_S', 'forever'],
    ['LLM_PROVIDER', 'anthropic'],
    ['LLM_PROVIDER', 'openai'],
    ['OPENAI_BASE_URL', 'not a url'],
    ['LLM_CALL_TIMEOUT_S', '0'],
    ['LLM_MAX_ATTEMPTS', '0'],
    ['HEALTH_PORT', '99999'],
    ['JOB_STREAM_PARTITIONS', '0'],
    ['JOB_STREAM_PARTITIONS', '1025'],
    ['WORKFLOW_RUN_RETENTION_DAYS', '-1'],
    ['WORKFLOW_RUN_RETENTION_DAYS', 'a month'],
    ['WORKFLOW_RUN_RETENTION_DAYS', '3651'],
  ])('rejects %s=%s, naming it', (variable, value) => {
    expect(problemsOf({ [variable]: value })).toEqual([variable]);
  });
});
