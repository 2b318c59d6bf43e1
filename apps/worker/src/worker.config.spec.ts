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
      otlpProtocol: 'http/protobuf',
      otelScheduleDelayMs: 5000,
    });
  });

  it('reads TENANT_TOKEN_LIMITS when it calls the provider itself, and not through the gateway (the api reserves)', () => {
    expect(loadWorkerConfig({}).tenantTokenLimits).toBeUndefined();
    expect(loadWorkerConfig({ TENANT_TOKEN_LIMITS: 'acme=500/1m' }).tenantTokenLimits?.byTenant.get('acme')).toEqual({
      tokens: 500,
      windowMs: 60_000,
      window: '1m',
    });
    expect(() => loadWorkerConfig({ TENANT_TOKEN_LIMITS: 'acme=500' })).toThrow(/TENANT_TOKEN_LIMITS.*entry 1/);
    const gateway = { INTERNAL_API_KEY: 'internal-0123456789', LLM_GATEWAY_URL: 'http://api:3000' };
    // Neither read nor checked in gateway mode, like the provider's variables.
    expect(loadWorkerConfig({ ...gateway, TENANT_TOKEN_LIMITS: 'acme=500' }).tenantTokenLimits).toBeUndefined();
  });

  it('calls the provider directly by default: no gateway, no internal key', () => {
    expect(loadWorkerConfig({})).toMatchObject({ internalApiKey: undefined, llmGatewayUrl: undefined });
  });

  it.each([
    ['a path', 'http://api:3000/v1'],
    ['a path', 'http://api:3000/api/'],
    ['a query', 'http://api:3000/?x=1'],
    ['a fragment', 'http://api:3000/#v1'],
    ['credentials', 'http://user:hunter2@api:3000'],
  ])('refuses an LLM_GATEWAY_URL with %s (%s): the api’s base URL only, the message naming /v1', (what, url) => {
    const env = { INTERNAL_API_KEY: 'internal-0123456789', LLM_GATEWAY_URL: url };
    expect(problemsOf(env)).toEqual(['LLM_GATEWAY_URL']);
    expect(() => loadWorkerConfig(env)).toThrow(new RegExp(`LLM_GATEWAY_URL.*without /v1.*has ${what}`));
    expect(() => loadWorkerConfig(env)).not.toThrow(/hunter2/);
  });

  it('skips the provider checks in gateway mode: LLM_PROVIDER=openai needs no OPENAI_API_KEY, and none is kept', () => {
    const gateway = { INTERNAL_API_KEY: 'internal-0123456789', LLM_GATEWAY_URL: 'http://api:3000' };
    // Direct, the same settings stop the start.
    expect(problemsOf({ LLM_PROVIDER: 'openai', OPENAI_BASE_URL: 'not a url' })).toEqual([
      'LLM_PROVIDER',
      'OPENAI_BASE_URL',
    ]);
    expect(
      loadWorkerConfig({ ...gateway, LLM_PROVIDER: 'openai', OPENAI_BASE_URL: 'not a url', OPENAI_MODEL: 'gpt-x' }),
    ).toMatchObject({ llmGatewayUrl: 'http://api:3000', openaiApiKey: undefined, openaiModel: 'gpt-x' });
    expect(loadWorkerConfig({ ...gateway, OPENAI_API_KEY: 'sk-unused' }).openaiApiKey).toBeUndefined();
    expect(problemsOf({ ...gateway, LLM_PROVIDER: 'anthropic' })).toEqual([]);
  });

  it('takes INTERNAL_API_KEY of 24+ characters only in production', () => {
    const env = { NODE_ENV: 'production', LLM_GATEWAY_URL: 'http://api:3000' };
    expect(problemsOf({ ...env, INTERNAL_API_KEY: 'internal-01234567890123' })).toEqual(['INTERNAL_API_KEY']);
    expect(problemsOf({ ...env, INTERNAL_API_KEY: 'internal-012345678901234' })).toEqual([]);
  });

  it('takes INTERNAL_API_KEY and LLM_GATEWAY_URL together, the URL without a trailing slash', () => {
    expect(
      loadWorkerConfig({ INTERNAL_API_KEY: 'internal-0123456789', LLM_GATEWAY_URL: 'http://api:3000/' }),
    ).toMatchObject({ internalApiKey: 'internal-0123456789', llmGatewayUrl: 'http://api:3000' });
    expect(
      loadWorkerConfig({ INTERNAL_API_KEY: 'internal-0123456789', LLM_GATEWAY_URL: 'https://api.example.com' })
        .llmGatewayUrl,
    ).toBe('https://api.example.com');
  });

  it('stops the start when only one of INTERNAL_API_KEY and LLM_GATEWAY_URL is set, naming LLM_GATEWAY_URL', () => {
    expect(problemsOf({ INTERNAL_API_KEY: 'internal-0123456789' })).toEqual(['LLM_GATEWAY_URL']);
    expect(() => loadWorkerConfig({ INTERNAL_API_KEY: 'internal-0123456789' })).toThrow(
      /LLM_GATEWAY_URL.*INTERNAL_API_KEY is set: set both/,
    );
    expect(problemsOf({ LLM_GATEWAY_URL: 'http://api:3000' })).toEqual(['LLM_GATEWAY_URL']);
    expect(() => loadWorkerConfig({ LLM_GATEWAY_URL: 'http://api:3000' })).toThrow(
      /LLM_GATEWAY_URL.*INTERNAL_API_KEY is not: set both/,
    );
  });

  it.each([
    ['INTERNAL_API_KEY', 'too-short-key', 'http://api:3000'],
    ['INTERNAL_API_KEY', 'with spaces 0123456789', 'http://api:3000'],
    ['LLM_GATEWAY_URL', 'internal-0123456789', 'ftp://api'],
    ['LLM_GATEWAY_URL', 'internal-0123456789', 'api:3000/v1 x'],
  ])('rejects a bad %s, naming it and never echoing the key', (variable, key, url) => {
    expect(problemsOf({ INTERNAL_API_KEY: key, LLM_GATEWAY_URL: url })).toEqual([variable]);
    expect(() => loadWorkerConfig({ INTERNAL_API_KEY: key, LLM_GATEWAY_URL: url })).not.toThrow(key);
  });

  it("takes a retention just past the run record's life", () => {
    expect(loadWorkerConfig({ WORKFLOW_RUN_RETENTION_DAYS: '8' }).workflowRunRetentionDays).toBe(8);
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
    // Within the run record's 7 days: a finished run would read as queued again once its row is gone.
    ['WORKFLOW_RUN_RETENTION_DAYS', '1'],
    ['WORKFLOW_RUN_RETENTION_DAYS', '7'],
  ])('rejects %s=%s, naming it', (variable, value) => {
    expect(problemsOf({ [variable]: value })).toEqual([variable]);
  });
});
