import { ConfigurableModuleBuilder } from '@nestjs/common';

export interface OutboxRelayOptions {
  /** For the dedicated LISTEN connection (the queries use the app's pool). */
  readonly databaseUrl: string;
  /** Unset: the log sender. */
  readonly webhookUrl?: string;
  /** Each send is abandoned after this (NOTIFY_TIMEOUT_S). */
  readonly sendTimeoutMs: number;
  /** How long a claim holds its rows; longer than `sendTimeoutMs`. */
  readonly leaseMs: number;
  readonly batch: number;
  /** Total attempts; the failure that reaches it parks the row. */
  readonly maxAttempts: number;
  /** The fallback pass interval when no notification comes. */
  readonly pollMs: number;
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  readonly retentionDays: number;
  /** Rows per retention DELETE statement. Default 500. */
  readonly retentionBatch?: number;
  /** How often retention runs (also once at start). Default hourly. */
  readonly retentionIntervalMs?: number;
  /**
   * The relay traces (tracingOn): its claim reads each row's `traceparent` for the send's span. Off, the column is
   * not named at all, so the relay works on a database not migrated to it yet.
   */
  readonly traced: boolean;
  /** The backoff's random source in [0, 1). Default Math.random. */
  readonly random?: () => number;
}

export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: OUTBOX_RELAY_OPTIONS,
  OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<OutboxRelayOptions>({ moduleName: 'OutboxRelay' })
  .setClassMethodName('forRoot')
  .build();
