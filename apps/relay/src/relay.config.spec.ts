import { configProblems, ConfigValidationError } from '@app/config';
import { leaseFor, loadRelayConfig } from './relay.config';

const problemsOf = (env: Record<string, string>) => configProblems(loadRelayConfig, env);

describe('relay configuration', () => {
  it('has the documented defaults', () => {
    expect(loadRelayConfig({})).toEqual({
      nodeEnv: 'development',
      redisUrl: 'redis://127.0.0.1:6379',
      databaseUrl: 'postgres://postgres@127.0.0.1:5432/postgres',
      logLevel: 'info',
      healthPort: 3002,
      httpRequestTimeoutMs: 30_000,
      httpKeepAliveTimeoutMs: 65_000,
      notifyWebhookUrl: undefined,
      notifyTimeoutMs: 10_000,
      outboxBatch: 20,
      outboxMaxAttempts: 10,
      outboxPollMs: 1000,
      outboxRetentionDays: 7,
      outboxBackoffBaseMs: 1000,
      outboxBackoffMaxMs: 300_000,
      outboxLeaseMs: 21_000,
      otlpEndpoint: undefined,
      otlpProtocol: 'http/protobuf',
      otelScheduleDelayMs: 5000,
    });
  });

  it('takes a webhook URL and fractional timeouts, and derives a lease that outlasts the send', () => {
    const config = loadRelayConfig({ NOTIFY_WEBHOOK_URL: 'https://hooks.example.com/notify', NOTIFY_TIMEOUT_S: '0.5' });
    expect(config.notifyWebhookUrl).toBe('https://hooks.example.com/notify');
    expect(config.notifyTimeoutMs).toBe(500);
    expect(config.outboxLeaseMs).toBe(2000);
    for (const timeout of [50, 1000, 10_000, 300_000]) expect(leaseFor(timeout)).toBeGreaterThan(timeout + 500);
  });

  it.each([
    ['HEALTH_PORT', 'http'],
    ['OTEL_EXPORTER_OTLP_ENDPOINT', 'collector:4318'],
    ['OTEL_EXPORTER_OTLP_PROTOCOL', 'grpc'],
    ['OTEL_BSP_SCHEDULE_DELAY', '5s'],
    ['NOTIFY_WEBHOOK_URL', 'ftp://x'],
    ['NOTIFY_WEBHOOK_URL', 'not a url'],
    ['NOTIFY_TIMEOUT_S', 'abc'],
    ['NOTIFY_TIMEOUT_S', '0'],
    ['NOTIFY_TIMEOUT_S', '-1'],
    ['OUTBOX_BATCH', '0'],
    ['OUTBOX_BATCH', 'twenty'],
    ['OUTBOX_MAX_ATTEMPTS', '0'],
    ['OUTBOX_MAX_ATTEMPTS', '2.5'],
    ['OUTBOX_POLL_MS', '1s'],
    ['OUTBOX_POLL_MS', '0'],
    ['OUTBOX_RETENTION_DAYS', '0'],
    ['OUTBOX_RETENTION_DAYS', 'a week'],
    ['OUTBOX_BACKOFF_BASE_MS', '0'],
    ['OUTBOX_BACKOFF_BASE_MS', 'x'],
    ['OUTBOX_BACKOFF_MAX_MS', 'x'],
    ['OUTBOX_BACKOFF_MAX_MS', '999'],
  ])('rejects a malformed %s (%s), naming it', (variable, value) => {
    expect(problemsOf({ [variable]: value })).toEqual([variable]);
  });

  it('names every bad variable at once, and the cap against the base it must not undercut', () => {
    expect(problemsOf({ NOTIFY_TIMEOUT_S: 'abc', NOTIFY_WEBHOOK_URL: 'ftp://x', OUTBOX_BATCH: '-3' })).toEqual([
      'NOTIFY_WEBHOOK_URL',
      'NOTIFY_TIMEOUT_S',
      'OUTBOX_BATCH',
    ]);
    expect(problemsOf({ OUTBOX_BACKOFF_BASE_MS: '5000', OUTBOX_BACKOFF_MAX_MS: '4000' })).toEqual([
      'OUTBOX_BACKOFF_MAX_MS',
    ]);
    expect(problemsOf({ OUTBOX_BACKOFF_BASE_MS: 'x', OUTBOX_BACKOFF_MAX_MS: '4000' })).toEqual([
      'OUTBOX_BACKOFF_BASE_MS',
    ]);
  });

  it('says what is wrong, without echoing a password from the webhook URL', () => {
    try {
      loadRelayConfig({ NOTIFY_WEBHOOK_URL: 'ftp://user:hunter2@hooks.example.com/x', NOTIFY_TIMEOUT_S: 'abc' });
      throw new Error('expected a ConfigValidationError');
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigValidationError);
      const message = (err as Error).message;
      expect(message).toContain('NOTIFY_TIMEOUT_S must be a number of seconds, got "abc"');
      expect(message).toContain('NOTIFY_WEBHOOK_URL must use http: or https:');
      expect(message).not.toContain('hunter2');
    }
  });
});
