import { BeforeApplicationShutdown, Inject, Injectable, Logger, OnApplicationBootstrap } from '@nestjs/common';
import { MicroBatcher } from '@app/batching';
import { backoffDelay } from '@app/config';
import { HealthChecksRegistry } from '@app/health';
import { deleteInBatches } from '@app/persistence';
import { inSpanFrom, setOutcome, SpanKind } from '@app/tracing';
import { PinoLogger } from 'nestjs-pino';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { DataSource } from 'typeorm';
import {
  InjectNotificationSender,
  NotificationRejectedError,
  type NotificationSender,
} from './notification-sender.interface';
import { OutboxListener } from './outbox-listener';
import { OUTBOX_RELAY_OPTIONS, type OutboxRelayOptions } from './outbox-relay.module-definition';
import { OutboxRelayMetrics, type SendOutcome } from './outbox-relay.metrics';
import { OutboxRelayRepository, type ClaimedMessage, type SentRow } from './outbox-relay.repository';

/** What one pass did. `leaseLost` and `unrecorded` rows will be sent again. */
export interface RelayPassResult {
  readonly claimed: number;
  readonly sent: number;
  readonly failed: number;
  readonly parked: number;
  /** Sent or failed, but another relay had taken the row over: nothing recorded. */
  readonly leaseLost: number;
  /** The result could not be written (PostgreSQL unreachable): the lease runs out and the row is tried again. */
  readonly unrecorded: number;
}

type RowResult = SendOutcome | 'leaseLost' | 'unrecorded';

export const RELAY_LOOP = 'outbox-relay';
export const LISTEN_READINESS = 'outbox_listen';
const RETENTION_BATCH = 500;
const RETENTION_INTERVAL_MS = 60 * 60 * 1000;
const LAST_ERROR_MAX = 500;

/** The send did not finish within NOTIFY_TIMEOUT_S. */
export class SendTimeoutError extends Error {
  constructor(readonly timeoutMs: number) {
    super(`timeout after ${timeoutMs} ms`);
    this.name = 'SendTimeoutError';
  }
}

/** OUTBOX_BATCH is at most 1000; a few statements' worth of a full batch. */
const MAX_SENT_PER_STATEMENT = 256;
/** One statement commits while the next gathers; a second keeps a slow commit from holding up the rest. */
const SENT_STATEMENTS_IN_FLIGHT = 2;

/**
 * Drains the outbox: claim due rows with a lease (one short transaction),
 * send them concurrently without holding any lock, record each result as it
 * comes, conditional on the lease still being ours. Runs when a commit
 * notifies `outbox_new`, and every OUTBOX_POLL_MS as a fallback; a burst of
 * notifications costs one more pass, and full batches are drained back to
 * back.
 */
@Injectable()
export class OutboxRelay implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger(OutboxRelay.name);
  private stopping = false;
  private loop: Promise<void> | undefined;
  private wakeRequested = false;
  /** Aborted to end the idle wait early. */
  private idling: AbortController | undefined;
  private retentionTimer: NodeJS.Timeout | undefined;
  private retention: Promise<unknown> | undefined;
  /**
   * The rows whose sends end together are recorded sent by one statement
   * (group commit): a pass sends a batch at once, so its answers come in
   * crowds. A failed statement fails each row in it, which leaves it
   * `unrecorded` (sent again after its lease), as its own failed update did.
   * A row is in one statement at a time (keyed by id).
   */
  private readonly sent = new MicroBatcher<SentRow, boolean>({
    run: (rows) => this.repository.markSentMany(this.dataSource.manager, rows),
    maxBatch: MAX_SENT_PER_STATEMENT,
    maxInFlight: SENT_STATEMENTS_IN_FLIGHT,
    keys: (row) => [row.id],
  });

  constructor(
    @Inject(OUTBOX_RELAY_OPTIONS) private readonly options: OutboxRelayOptions,
    private readonly dataSource: DataSource,
    private readonly repository: OutboxRelayRepository,
    @InjectNotificationSender() private readonly sender: NotificationSender,
    private readonly listener: OutboxListener,
    private readonly metrics: OutboxRelayMetrics,
    private readonly health: HealthChecksRegistry,
    private readonly pino: PinoLogger,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    // A pass can take a whole send timeout; the loop is stuck when it has been silent for much longer.
    this.health.registerLoop(RELAY_LOOP, 3 * this.options.pollMs + this.options.leaseMs);
    this.health.registerReadiness(LISTEN_READINESS, () => this.listener.check());
    // Not awaited: a database that is down at boot is retried by the listener and the loop.
    void this.listener.start({ onNotify: () => this.wake(), onListening: () => this.wake() });
    this.loop = this.run();
    this.runRetention();
    this.retentionTimer = setInterval(
      () => this.runRetention(),
      this.options.retentionIntervalMs ?? RETENTION_INTERVAL_MS,
    );
    this.retentionTimer.unref();
    const { webhookUrl } = this.options;
    this.logger.log(
      webhookUrl
        ? `relaying the outbox to the webhook at ${new URL(webhookUrl).origin} (batch ${this.options.batch}, poll ${this.options.pollMs} ms)`
        : 'relaying the outbox to the log sender (NOTIFY_WEBHOOK_URL is unset)',
    );
  }

  /** Claims nothing new, lets the running pass finish its sends and record them, then stops listening. */
  async beforeApplicationShutdown(): Promise<void> {
    this.stopping = true;
    clearInterval(this.retentionTimer);
    this.idling?.abort();
    await this.loop;
    await this.retention;
    await this.listener.stop();
    this.health.unregisterLoop(RELAY_LOOP);
  }

  /** Asks for a pass as soon as the current one (if any) is over. Calls in between coalesce into one. */
  wake(): void {
    this.wakeRequested = true;
    this.idling?.abort();
  }

  /** One claim-send-record pass. */
  async runOnce(): Promise<RelayPassResult> {
    const counts: Record<RowResult, number> = { sent: 0, failed: 0, parked: 0, leaseLost: 0, unrecorded: 0 };
    if (this.stopping) return { claimed: 0, ...counts };
    const { batch, leaseMs, maxAttempts, traced } = this.options;
    const claimed = await this.repository.claim(this.dataSource.manager, batch, leaseMs, maxAttempts, traced);
    // Every log line about a row carries its row id, dedupe key and job id.
    const results = await Promise.all(
      claimed.map((message) =>
        this.pino.runInContext(() => this.traced(message), {
          bindings: { outbox_id: message.id, dedupe_key: message.dedupeKey, job_id: message.payload.job_id },
        }),
      ),
    );
    for (const r of results) counts[r]++;
    return { claimed: claimed.length, ...counts };
  }

  /** Deletes sent rows older than OUTBOX_RETENTION_DAYS, a small batch per statement. */
  async purgeSent(): Promise<number> {
    return deleteInBatches(
      (limit) => this.repository.deleteSentBefore(this.dataSource.manager, this.options.retentionDays, limit),
      { limit: this.options.retentionBatch ?? RETENTION_BATCH, stopped: () => this.stopping },
    );
  }

  private async run(): Promise<void> {
    while (!this.stopping) {
      this.health.beat(RELAY_LOOP);
      // Cleared before the claim: a commit notified during this pass may not be in it, so it asks for another.
      this.wakeRequested = false;
      let full = false;
      try {
        const pass = await this.runOnce();
        full = pass.claimed === this.options.batch;
      } catch (err) {
        // PostgreSQL is probably down: wait a poll interval rather than spin on notifications.
        this.logger.error(`relay pass failed: ${describe(err)}`);
        this.wakeRequested = false;
      }
      if (this.stopping) break;
      if (full || this.wakeRequested) continue;
      await this.idle(this.options.pollMs);
    }
  }

  /** Sleeps `ms`, or until `wake()` or shutdown. */
  private async idle(ms: number): Promise<void> {
    const idling = new AbortController();
    this.idling = idling;
    try {
      await sleep(ms, undefined, { signal: idling.signal });
    } catch {
      // woken: the sleep rejects with an AbortError
    } finally {
      this.idling = undefined;
    }
  }

  /**
   * The row's send and record as a span continuing the trace of the step that wrote it (its `traceparent`
   * column): the webhook's request is its child and carries that trace's `traceparent`. A no-op when tracing is off.
   */
  private traced(message: ClaimedMessage): Promise<RowResult> {
    const options = () => ({
      kind: SpanKind.CONSUMER,
      attributes: {
        'messaging.system': 'postgresql',
        'messaging.operation.type': 'process',
        'messaging.destination.name': 'outbox',
        'messaging.message.id': message.id,
        'outbox.topic': message.topic,
        'outbox.dedupe_key': message.dedupeKey,
        'outbox.attempt': message.attempts + 1,
      },
    });
    return inSpanFrom(message.traceparent, 'deliver outbox', options, async (span) => {
      const result = await this.deliver(message);
      // Anything but `sent` is a send that failed or was not recorded: the row is tried again, or parked.
      setOutcome(span, result, result !== 'sent');
      return result;
    });
  }

  private async deliver(message: ClaimedMessage): Promise<RowResult> {
    const started = performance.now();
    let error: string | undefined;
    try {
      await this.sendWithTimeout(message);
    } catch (err) {
      error = describe(err).slice(0, LAST_ERROR_MAX);
    }
    this.metrics.sendDuration((performance.now() - started) / 1000, error === undefined);
    const em = this.dataSource.manager;
    const failures = message.attempts + 1;
    let outcome: SendOutcome;
    let recorded: boolean;
    try {
      if (error === undefined) {
        outcome = 'sent';
        recorded = await this.sent.submit({ id: message.id, lease: message.lease });
      } else if (failures >= this.options.maxAttempts) {
        outcome = 'parked';
        recorded = await this.repository.park(em, message.id, message.lease, error);
      } else {
        outcome = 'failed';
        const delay = backoffDelay(
          failures - 1,
          { baseMs: this.options.backoffBaseMs, capMs: this.options.backoffMaxMs, jitter: 'equal' },
          this.options.random,
        );
        recorded = await this.repository.markFailed(em, message.id, message.lease, error, delay);
      }
    } catch (err) {
      this.logger.error(`outbox row ${message.id}: result (${error ?? 'sent'}) not recorded: ${describe(err)}`);
      return 'unrecorded';
    }
    if (!recorded) {
      this.metrics.leaseWasLost();
      this.logger.warn(
        `outbox row ${message.id}: lease lost before recording (${error ?? 'sent'}); it will be sent again`,
      );
      return 'leaseLost';
    }
    this.metrics.recorded(outcome);
    if (outcome === 'parked') {
      this.logger.error(`outbox row ${message.id} (${message.dedupeKey}) parked after ${failures} attempts: ${error}`);
    } else if (outcome === 'failed') {
      this.logger.warn(`outbox row ${message.id}: attempt ${failures} failed: ${error}`);
    }
    return outcome;
  }

  /**
   * The sender gets an abort signal at the timeout, and the relay stops
   * waiting then even if the sender ignores it: the lease only covers a
   * bounded send. The deadline is a timer cleared when the send ends:
   * AbortSignal.timeout would keep its signal (and the request hanging on it)
   * alive for the whole timeout after every send.
   */
  private async sendWithTimeout(message: ClaimedMessage): Promise<void> {
    const timeoutMs = this.options.sendTimeoutMs;
    const deadline = new AbortController();
    const { signal } = deadline;
    const timer = setTimeout(() => deadline.abort(new SendTimeoutError(timeoutMs)), timeoutMs);
    // Listening before the sender does: at the timeout, the relay's own error wins over the sender's.
    const timedOut = once(signal, 'abort').then(() => signal.throwIfAborted());
    // Through a promise, so a sender that throws synchronously is a failed send like any other.
    const send = Promise.resolve().then(() =>
      this.sender.send({ topic: message.topic, dedupeKey: message.dedupeKey, payload: message.payload }, signal),
    );
    try {
      // race() handles the loser's late rejection too.
      await Promise.race([send, timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }

  private runRetention(): void {
    if (this.retention || this.stopping) return;
    this.retention = (async () => {
      const em = this.dataSource.manager;
      const parked = await this.repository.parkExhausted(em, this.options.maxAttempts);
      if (parked > 0) this.logger.error(`${parked} outbox rows had run out of attempts and are now parked`);
      const deleted = await this.purgeSent();
      if (deleted > 0)
        this.logger.log(`retention: deleted ${deleted} sent outbox rows older than ${this.options.retentionDays} days`);
    })()
      .catch((err: unknown) => this.logger.warn(`outbox retention failed: ${describe(err)}`))
      .finally(() => (this.retention = undefined));
  }
}

/** A short, log- and column-safe description of a failure. */
function describe(err: unknown): string {
  if (err instanceof NotificationRejectedError || err instanceof SendTimeoutError) return err.message;
  // Duck-typed: errors from Node's internals (fetch) may come from another realm than our Error.
  if (typeof err === 'object' && err !== null && typeof (err as Error).message === 'string') {
    const { name, message, cause } = err as Error;
    // fetch wraps the network error: "fetch failed" says nothing, its cause does (ECONNREFUSED, ...).
    return `${typeof name === 'string' ? name : 'Error'}: ${message}${causeOf(cause)}`;
  }
  return String(err);
}

function causeOf(cause: unknown): string {
  if (typeof cause !== 'object' || cause === null) return '';
  const { code, message } = cause as { code?: unknown; message?: unknown };
  if (typeof code === 'string') return ` (${code})`;
  return typeof message === 'string' && message !== '' ? ` (${message})` : '';
}
