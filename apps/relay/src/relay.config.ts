import { httpServerEnv } from '@app/http';
import { tracingEnv } from '@app/tracing';
import { commonEnv, ConfigFieldError, ConfigOf, type Env, env, parseConfig, processEnv } from '@app/config';

const BACKOFF_BASE_MS_DEFAULT = 1000;

/** Every variable the relay reads (INTERFACE.md); the manifests are checked against it. */
export const relayEnvSchema = {
  ...commonEnv,
  ...httpServerEnv,
  ...tracingEnv,
  healthPort: env.int('HEALTH_PORT', 3002, { min: 0, max: 65535 }, { describe: 'health and metrics' }),
  /** Unset: the log sender (quick start). */
  notifyWebhookUrl: env.optionalUrl('NOTIFY_WEBHOOK_URL', ['http:', 'https:'], {
    docDefault: 'unset: the log sender',
  }),
  notifyTimeoutMs: env.secondsAsMs(
    'NOTIFY_TIMEOUT_S',
    10,
    { min: 0.05, max: 300 },
    { describe: "one send's limit; the claim's lease is twice this plus 1 s" },
  ),
  outboxBatch: env.int('OUTBOX_BATCH', 20, { min: 1, max: 1000 }),
  outboxMaxAttempts: env.int(
    'OUTBOX_MAX_ATTEMPTS',
    10,
    { min: 1, max: 1000 },
    { describe: 'total attempts; the last failure parks the row' },
  ),
  outboxPollMs: env.int(
    'OUTBOX_POLL_MS',
    1000,
    { min: 10, max: 3_600_000 },
    { describe: 'a fallback: commits wake the relay' },
  ),
  outboxRetentionDays: env.int(
    'OUTBOX_RETENTION_DAYS',
    7,
    { min: 1, max: 3650 },
    { describe: 'sent rows older than this are deleted' },
  ),
  outboxBackoffBaseMs: env.int(
    'OUTBOX_BACKOFF_BASE_MS',
    BACKOFF_BASE_MS_DEFAULT,
    { min: 1, max: 3_600_000 },
    {
      describe:
        'the n-th failure waits half to all of min(max, base × 2^(n-1)), base being this and max ' +
        '`OUTBOX_BACKOFF_MAX_MS`; with the defaults a row is parked after about 4 to 9 minutes of failures',
    },
  ),
  outboxBackoffMaxMs: env.custom(
    'OUTBOX_BACKOFF_MAX_MS',
    (raw, all) => {
      const max = env.int('OUTBOX_BACKOFF_MAX_MS', 300_000, { min: 1, max: 86_400_000 }).parse(raw, all);
      // Compared only when the base itself is valid: a bad base is reported under its own name.
      const base = Number(all.OUTBOX_BACKOFF_BASE_MS?.trim() || BACKOFF_BASE_MS_DEFAULT);
      if (Number.isInteger(base) && max < base) {
        throw new ConfigFieldError(`must be at least OUTBOX_BACKOFF_BASE_MS (${base}), got ${max}`);
      }
      return max;
    },
    {
      docDefault: '`300000`',
      describe: 'the cap on the backoff (see `OUTBOX_BACKOFF_BASE_MS`); at least `OUTBOX_BACKOFF_BASE_MS`',
    },
  ),
};

export type RelayConfig = ConfigOf<typeof relayEnvSchema> & {
  /**
   * How long a claim holds its rows. Derived, not set: it must outlast a send
   * (NOTIFY_TIMEOUT_S) plus recording its result, or a second relay would
   * claim a row whose first send is still running.
   */
  readonly outboxLeaseMs: number;
};

/** The lease: twice the send timeout plus a second for the claim and the recording statements. */
export const leaseFor = (notifyTimeoutMs: number): number => 2 * notifyTimeoutMs + 1000;

/** The relay's whole configuration, validated once at boot; throws naming every bad variable. */
export function loadRelayConfig(source: Env = processEnv()): RelayConfig {
  const parsed = parseConfig(relayEnvSchema, source);
  return { ...parsed, outboxLeaseMs: leaseFor(parsed.notifyTimeoutMs) };
}
