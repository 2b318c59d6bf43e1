import { configProblems, ConfigValidationError } from '@app/config';
import { apiDrainMs, loadApiConfig } from './api.config';
import { DEMO_API_KEYS } from './auth/api-keys';

const problemsOf = (env: Record<string, string>) => configProblems(loadApiConfig, env);

describe('api configuration', () => {
  it('has the documented defaults', () => {
    expect(loadApiConfig({})).toEqual({
      nodeEnv: 'development',
      redisUrl: 'redis://127.0.0.1:6379',
      redisClusterNodes: undefined,
      redisDurability: 'replica',
      databaseUrl: 'postgres://postgres@127.0.0.1:5432/postgres',
      logLevel: 'info',
      httpRequestTimeoutMs: 30_000,
      httpKeepAliveTimeoutMs: 65_000,
      port: 3000,
      apiKeys: DEMO_API_KEYS,
      adminApiKey: 'demo-admin-key',
      internalApiKey: undefined,
      idempotencyLockTtlMs: 10_000,
      idempotencyResultTtlMs: 86_400_000,
      idempotencyStore: 'redis',
      jobStreamPartitions: 1,
      llmProvider: 'fake',
      openaiApiKey: undefined,
      openaiBaseUrl: undefined,
      openaiModel: 'gpt-4.1-mini',
      gatewayUpstreams: undefined,
      tenantTokenLimits: undefined,
      gatewayTimeoutMs: 300_000,
      paymentsUrl: undefined,
      paymentsTimeoutMs: 10_000,
      otlpEndpoint: undefined,
      otlpProtocol: 'http/protobuf',
      otelScheduleDelayMs: 5000,
    });
  });

  it('pays refunds with the built-in fake unless PAYMENTS_URL names a provider, in production too', () => {
    expect(loadApiConfig({}).paymentsUrl).toBeUndefined();
    // Blank is unset, as for every variable.
    expect(loadApiConfig({ PAYMENTS_URL: '' }).paymentsUrl).toBeUndefined();
    expect(loadApiConfig({ PAYMENTS_URL: '   ' }).paymentsUrl).toBeUndefined();
    expect(loadApiConfig({ PAYMENTS_URL: 'https://payments.example.com/v1' }).paymentsUrl).toBe(
      'https://payments.example.com/v1',
    );
    expect(loadApiConfig({ PAYMENTS_URL: 'http://127.0.0.1:8089' }).paymentsUrl).toBe('http://127.0.0.1:8089');
    // As LLM_PROVIDER=fake is: production does not force a provider (docker-compose.yml runs the fake with
    // NODE_ENV=production).
    expect(loadApiConfig({ NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef' }).paymentsUrl).toBeUndefined();
  });

  it.each([
    ['ftp://x', /PAYMENTS_URL.*must use http: or https:/],
    ['not a url', /PAYMENTS_URL.*must be a URL/],
    ['payments.example.com', /PAYMENTS_URL.*must be a URL/],
    ['/payouts', /PAYMENTS_URL.*must be a URL/],
  ])('stops the start for PAYMENTS_URL=%s, naming it', (value, message) => {
    expect(problemsOf({ PAYMENTS_URL: value })).toEqual(['PAYMENTS_URL']);
    expect(() => loadApiConfig({ PAYMENTS_URL: value })).toThrow(message);
  });

  it('takes JOB_STREAM_PARTITIONS from 1 to 1024, and nothing else', () => {
    expect(loadApiConfig({ JOB_STREAM_PARTITIONS: '3' }).jobStreamPartitions).toBe(3);
    expect(loadApiConfig({ JOB_STREAM_PARTITIONS: '1024' }).jobStreamPartitions).toBe(1024);
    for (const value of ['0', '1025', '-1', '2.5', 'three'])
      expect(problemsOf({ JOB_STREAM_PARTITIONS: value })).toEqual(['JOB_STREAM_PARTITIONS']);
  });

  it('takes REDIS_DURABILITY replica (the default) or strict, and nothing else', () => {
    expect(loadApiConfig({ REDIS_DURABILITY: 'strict' }).redisDurability).toBe('strict');
    for (const value of ['STRICT', 'none', 'replicas'])
      expect(problemsOf({ REDIS_DURABILITY: value })).toEqual(['REDIS_DURABILITY']);
  });

  it('bounds PAYMENTS_TIMEOUT_S to 1..120 s', () => {
    expect(loadApiConfig({ PAYMENTS_TIMEOUT_S: '1' }).paymentsTimeoutMs).toBe(1000);
    expect(loadApiConfig({ PAYMENTS_TIMEOUT_S: '120' }).paymentsTimeoutMs).toBe(120_000);
    expect(loadApiConfig({ PAYMENTS_TIMEOUT_S: '' }).paymentsTimeoutMs).toBe(10_000);
    for (const value of ['0', '0.5', '121', '-1', 'ten', '10s']) {
      expect({ value, problems: problemsOf({ PAYMENTS_TIMEOUT_S: value }) }).toEqual({
        value,
        problems: ['PAYMENTS_TIMEOUT_S'],
      });
    }
  });

  it('drains long enough for a refund in flight: three provider calls and a PostgreSQL query after the last request arrives', () => {
    // 30 s gateway drain + 2 s settle + 30 s arrival + (3 x 10 s + 20 s PostgreSQL).
    expect(apiDrainMs(loadApiConfig({}))).toBe(112_000);
    expect(apiDrainMs(loadApiConfig({ PAYMENTS_TIMEOUT_S: '120' }))).toBe(
      30_000 + 2_000 + 30_000 + 3 * 120_000 + 20_000,
    );
    const base = apiDrainMs(loadApiConfig({ PAYMENTS_TIMEOUT_S: '1' }));
    expect(apiDrainMs(loadApiConfig({ PAYMENTS_TIMEOUT_S: '11' })) - base).toBe(3 * 10_000);
  });

  it('forwards the gateway to the provider the worker uses: openai once OPENAI_API_KEY is set', () => {
    expect(loadApiConfig({ OPENAI_API_KEY: 'sk-x', OPENAI_BASE_URL: 'http://127.0.0.1:9/v1' })).toMatchObject({
      llmProvider: 'openai',
      openaiApiKey: 'sk-x',
      openaiBaseUrl: 'http://127.0.0.1:9/v1',
    });
    expect(problemsOf({ LLM_PROVIDER: 'openai' })).toEqual(['LLM_PROVIDER']);
    expect(() => loadApiConfig({ LLM_PROVIDER: 'openai' })).toThrow(/LLM_PROVIDER.*OPENAI_API_KEY is unset/);
    expect(problemsOf({ GATEWAY_TIMEOUT_S: '0' })).toEqual(['GATEWAY_TIMEOUT_S']);
  });

  describe('TENANT_TOKEN_LIMITS', () => {
    it('reads tenant=tokens/window entries and * for the tenants not named', () => {
      const limits = loadApiConfig({
        API_KEYS: 't1:key-one,t2:key-two',
        TENANT_TOKEN_LIMITS: 't1=200000/1d, t2=5000/1m,*=900/30s',
      }).tenantTokenLimits;
      expect(limits?.byTenant).toEqual(
        new Map([
          ['t1', { tokens: 200_000, windowMs: 86_400_000, window: '1d' }],
          ['t2', { tokens: 5000, windowMs: 60_000, window: '1m' }],
        ]),
      );
      expect(limits?.others).toEqual({ tokens: 900, windowMs: 30_000, window: '30s' });
      expect(loadApiConfig({ TENANT_TOKEN_LIMITS: '' }).tenantTokenLimits).toBeUndefined();
    });

    it.each([
      ['no =', 't1=100/1m,t2:100/1m', /entry 2 is not tenant=tokens\/window/],
      ['an empty entry', 't1=100/1m,', /entry 2 is not tenant=tokens\/window \(it is empty/],
      ['a window of weeks', 't1=100/1w', /entry 1 is not tenant=tokens\/window with a window of Ns, Nm, Nh or Nd/],
      ['no window', 't1=100', /entry 1 is not tenant=tokens\/window/],
      ['zero tokens', 't1=0/1m', /entry 1: the tokens must be a positive whole number/],
      ['a zero window', 't1=10/0s', /entry 1: the window must be positive/],
      ['negative tokens', 't1=-5/1m', /entry 1 is not tenant=tokens\/window/],
      ['a tenant named twice', 't1=10/1m,t2=5/1h,t1=20/1d', /entry 3: the tenant t1 is named twice/],
      ['* twice', '*=10/1m,*=20/1m', /entry 2: \* is given a limit twice/],
      [
        'a tenant API_KEYS does not have (a typo would leave the one meant unlimited)',
        'demo=10/1m,dmeo=5/1m',
        /names tenants API_KEYS does not have: dmeo/,
      ],
    ])('stops the start on %s, naming the entry', (_, raw, message) => {
      const env = { API_KEYS: 't1:key-one,t2:key-two,demo:demo-key', TENANT_TOKEN_LIMITS: raw };
      expect(problemsOf(env)).toEqual(['TENANT_TOKEN_LIMITS']);
      expect(() => loadApiConfig(env)).toThrow(message);
    });
  });

  describe('GATEWAY_UPSTREAMS', () => {
    const entry = (fields: object = {}) => ({
      name: 'primary',
      base_url: 'https://user:s3cret@primary.example.com/v1',
      api_key_env: 'PRIMARY_KEY',
      models: ['gpt-*'],
      ...fields,
    });
    const load = (upstreams: unknown, env: Record<string, string> = { PRIMARY_KEY: 'sk-primary-secret' }) =>
      loadApiConfig({
        GATEWAY_UPSTREAMS: typeof upstreams === 'string' ? upstreams : JSON.stringify(upstreams),
        ...env,
      });

    it('reads the upstreams in order, each key from the variable it names', () => {
      const config = load([entry(), entry({ name: 'second', api_key_env: 'SECOND_KEY', models: ['gpt-4.1', '*'] })], {
        PRIMARY_KEY: 'sk-primary-secret',
        SECOND_KEY: 'sk-second-secret',
      });
      expect(config.gatewayUpstreams).toEqual([
        {
          name: 'primary',
          baseUrl: 'https://user:s3cret@primary.example.com/v1',
          apiKeyEnv: 'PRIMARY_KEY',
          apiKey: 'sk-primary-secret',
          models: ['gpt-*'],
        },
        {
          name: 'second',
          baseUrl: 'https://user:s3cret@primary.example.com/v1',
          apiKeyEnv: 'SECOND_KEY',
          apiKey: 'sk-second-secret',
          models: ['gpt-4.1', '*'],
        },
      ]);
      expect(loadApiConfig({ GATEWAY_UPSTREAMS: '' }).gatewayUpstreams).toBeUndefined();
    });

    it.each([
      ['not JSON', '[{"name":', /is not JSON/],
      ['not an array', { name: 'x' }, /non-empty JSON array/],
      ['an empty array', [], /non-empty JSON array/],
      ['an entry that is no object', ['primary'], /entry 1 is not an object/],
      ['a repeated name', [entry(), entry()], /entry 2: the name primary is given to two upstreams/],
      ['a name that cannot be a label', [entry({ name: 'has space' })], /entry 1: name must be/],
      [
        'an unset api_key_env',
        [entry({ api_key_env: 'NOT_SET_ANYWHERE' })],
        /entry 1 \(primary\): api_key_env names NOT_SET_ANYWHERE, which is unset/,
      ],
      [
        'a base_url that is not http',
        [entry({ base_url: 'ftp://user:s3cret@x/' })],
        /entry 1 \(primary\): base_url must be/,
      ],
      ['no models', [entry({ models: [] })], /models must be a non-empty array/],
      ['a * inside a model', [entry({ models: ['gpt-*-mini'] })], /models\[0\] must be a model name, or a prefix/],
      [
        'an unknown field',
        [entry({ api_key: 'sk-inline' })],
        /entry 1 has a field this version does not know: "api_key"/,
      ],
    ])('stops the start on %s, naming the entry and never a URL or key', (_, upstreams, message) => {
      let error: unknown;
      try {
        load(upstreams);
      } catch (err) {
        error = err;
      }
      expect(error).toBeInstanceOf(ConfigValidationError);
      const text = (error as Error).message;
      expect(text).toMatch(/GATEWAY_UPSTREAMS/);
      expect(text).toMatch(message);
      expect(text).not.toMatch(/s3cret|sk-primary-secret|sk-inline/);
    });
  });

  it('keeps idempotency records in Redis unless IDEMPOTENCY_STORE says postgres', () => {
    expect(loadApiConfig({ IDEMPOTENCY_STORE: 'postgres' }).idempotencyStore).toBe('postgres');
    expect(problemsOf({ IDEMPOTENCY_STORE: 'Postgres' })).toEqual(['IDEMPOTENCY_STORE']);
  });

  it('parses API_KEYS into tenants, several keys per tenant allowed', () => {
    expect(loadApiConfig({ API_KEYS: 'acme:k1, acme:k2,globex:k3' }).apiKeys).toEqual([
      { tenant: 'acme', key: 'k1' },
      { tenant: 'acme', key: 'k2' },
      { tenant: 'globex', key: 'k3' },
    ]);
  });

  it.each([
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['REDIS_URL', 'localhost:6379'],
    ['REDIS_URL', 'http://127.0.0.1:6379'],
    ['DATABASE_URL', 'mysql://db'],
    ['LOG_LEVEL', 'loud'],
    ['IDEMPOTENCY_LOCK_TTL_S', '-1'],
    ['IDEMPOTENCY_LOCK_TTL_S', '0'],
    ['IDEMPOTENCY_RESULT_TTL_S', 'a day'],
    ['IDEMPOTENCY_STORE', 'memcached'],
    ['API_KEYS', 'no-colon'],
    ['API_KEYS', 'bad tenant:key'],
    ['API_KEYS', 'a:same,b:same'],
    ['API_KEYS', 'a:'],
    ['HTTP_REQUEST_TIMEOUT_S', '0'],
    ['HTTP_KEEP_ALIVE_TIMEOUT_S', 'forever'],
  ])('rejects a malformed %s (%s), naming it', (variable, value) => {
    expect(problemsOf({ [variable]: value })).toEqual([variable]);
  });

  const apiKeysMessage = (value: string, env: Record<string, string> = {}): string => {
    try {
      loadApiConfig({ ...env, API_KEYS: value });
    } catch (err) {
      if (err instanceof ConfigValidationError) return err.message;
      throw err;
    }
    throw new Error(`API_KEYS=${value} was accepted`);
  };

  it.each([
    [
      'an entry that reads two ways (a second colon)',
      'acme:k1-0123456789,a:POST:secret-k2-0123',
      'entry 2',
      "more than one ':'",
    ],
    ['an empty tenant', ':secret-k1-0123', 'entry 1', 'empty tenant'],
    ['an empty key', 'acme:k1-0123456789,globex:', 'entry 2', 'empty key'],
    ['an empty entry (a stray comma)', 'acme:secret-k1-0123,', 'entry 2', 'empty'],
    [
      'one key given to two tenants',
      'acme:secret-shared-0123,globex:secret-shared-0123',
      'entry 2',
      'the key of entry 1',
    ],
    ['an entry written key first, in production', 'secret-live-0123456789:acme', 'entry 1', 'at least 16 characters'],
  ])('stops the start for %s, naming the entry and never the key', (_, value, entry, why) => {
    const message = apiKeysMessage(value, value.includes('live') ? { NODE_ENV: 'production' } : {});
    expect(message).toContain('API_KEYS');
    expect(message).toContain(entry);
    expect(message).toContain(why);
    for (const secret of value.split(/[,:]/).filter((part) => part.includes('secret')))
      expect(message).not.toContain(secret);
  });

  it('keeps one tenant with two keys: that is how keys are rotated', () => {
    expect(
      loadApiConfig({ API_KEYS: 'acme:old-key-0123456789,acme:new-key-0123456789' }).apiKeys.map((e) => e.tenant),
    ).toEqual(['acme', 'acme']);
  });

  it('names every bad variable at once', () => {
    expect(problemsOf({ PORT: 'x', LOG_LEVEL: 'y' })).toEqual(['LOG_LEVEL', 'PORT']);
  });

  it('requires API_KEYS in production, with keys long enough', () => {
    expect(problemsOf({ NODE_ENV: 'production' })).toEqual(['API_KEYS']);
    expect(problemsOf({ NODE_ENV: 'production', API_KEYS: 'acme:short' })).toEqual(['API_KEYS']);
    expect(loadApiConfig({ NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef' }).apiKeys).toEqual([
      { tenant: 'acme', key: '0123456789abcdef' },
    ]);
  });

  it('keeps the admin key apart from tenant keys, and off in production unless set', () => {
    expect(problemsOf({ API_KEYS: 'acme:same-key-0123456789', ADMIN_API_KEY: 'same-key-0123456789' })).toEqual([
      'ADMIN_API_KEY',
    ]);
    expect(loadApiConfig({ NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef' }).adminApiKey).toBeUndefined();
    expect(
      problemsOf({ NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef', ADMIN_API_KEY: 'too-short' }),
    ).toEqual(['ADMIN_API_KEY']);
    expect(
      loadApiConfig({
        NODE_ENV: 'production',
        API_KEYS: 'acme:0123456789abcdef',
        ADMIN_API_KEY: 'admin-0123456789abcdefghijk',
      }).adminApiKey,
    ).toBe('admin-0123456789abcdefghijk');
  });

  it('takes INTERNAL_API_KEY of 16+ printable characters, unset by default in production too, never echoed', () => {
    const key = 'internal-0123456789';
    expect(loadApiConfig({ INTERNAL_API_KEY: key }).internalApiKey).toBe(key);
    expect(loadApiConfig({ INTERNAL_API_KEY: '  ' }).internalApiKey).toBeUndefined();
    // No demo value anywhere: unset is the direct path, not a default key.
    expect(loadApiConfig({ NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef' }).internalApiKey).toBeUndefined();
    for (const value of ['short-key-123', '0123456789abcde', 'has a space 0123456789']) {
      expect({ value, problems: problemsOf({ INTERNAL_API_KEY: value }) }).toEqual({
        value,
        problems: ['INTERNAL_API_KEY'],
      });
      expect(() => loadApiConfig({ INTERNAL_API_KEY: value })).not.toThrow(new RegExp(value));
    }
    expect(() => loadApiConfig({ INTERNAL_API_KEY: 'short-key-123' })).toThrow(
      /INTERNAL_API_KEY.*at least 16 characters/,
    );
  });

  it('takes INTERNAL_API_KEY of 24+ characters only in production, as ADMIN_API_KEY', () => {
    const production = { NODE_ENV: 'production', API_KEYS: 'acme:0123456789abcdef' };
    const short = 'internal-01234567890123'; // 23: enough outside production
    expect(loadApiConfig({ INTERNAL_API_KEY: short }).internalApiKey).toBe(short);
    expect(problemsOf({ ...production, INTERNAL_API_KEY: short })).toEqual(['INTERNAL_API_KEY']);
    expect(() => loadApiConfig({ ...production, INTERNAL_API_KEY: short })).toThrow(
      /INTERNAL_API_KEY.*at least 24 characters in production/,
    );
    expect(() => loadApiConfig({ ...production, INTERNAL_API_KEY: short })).not.toThrow(short);
    expect(loadApiConfig({ ...production, INTERNAL_API_KEY: `${short}4` }).internalApiKey).toBe(`${short}4`);
  });

  it('keeps INTERNAL_API_KEY apart from every tenant key and the admin key', () => {
    const key = 'shared-0123456789abcdefgh';
    expect(problemsOf({ API_KEYS: `acme:${key}`, INTERNAL_API_KEY: key })).toEqual(['INTERNAL_API_KEY']);
    expect(() => loadApiConfig({ API_KEYS: `acme:${key}`, INTERNAL_API_KEY: key })).toThrow(
      /INTERNAL_API_KEY.*differ from every tenant key/,
    );
    expect(problemsOf({ ADMIN_API_KEY: key, INTERNAL_API_KEY: key })).toEqual(['INTERNAL_API_KEY']);
  });

  it('never echoes a password from a URL in its message', () => {
    try {
      loadApiConfig({ DATABASE_URL: 'mysql://user:hunter2@db/x' });
      throw new Error('expected a ConfigValidationError');
    } catch (err) {
      expect((err as Error).message).not.toContain('hunter2');
    }
  });
});
