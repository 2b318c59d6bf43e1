import { Inject, Injectable, Logger } from '@nestjs/common';
import { backoffDelay } from '@app/config';
import { OUTBOX_CHANNEL } from '@app/persistence';
import { once } from 'node:events';
import { Client } from 'pg';
import { OUTBOX_RELAY_OPTIONS, type OutboxRelayOptions } from './outbox-relay.module-definition';

export interface OutboxListenerHandlers {
  /** A row was committed (one call per notification; the caller coalesces). */
  onNotify(): void;
  /**
   * LISTEN is (re-)established. Notifications sent while it was down are lost,
   * so the caller runs a pass now.
   */
  onListening(): void;
}

/** Equal jitter, so a reconnect never comes back at once to a database that is down. */
const RECONNECT_BACKOFF = { baseMs: 100, capMs: 5000, jitter: 'equal' } as const;
/**
 * The first TCP keepalive probe after this much silence (the OS default is
 * about 2 h): a LISTEN connection is idle between notifications, so a peer or
 * NAT that dropped it silently is otherwise noticed only hours later.
 */
const KEEPALIVE_IDLE_MS = 10_000;
/**
 * The readiness budget (the health controller's timeout for each check). A
 * healthy connection answers SELECT 1 in milliseconds; one that does not is
 * replaced, which costs a connection and one pass.
 */
const CHECK_TIMEOUT_MS = 1000;

/**
 * LISTEN `outbox_new` on a dedicated connection (a pooled one would be handed
 * to other queries and lose the subscription). A lost connection is opened
 * again with jittered exponential backoff; readiness fails meanwhile.
 */
@Injectable()
export class OutboxListener {
  private readonly logger = new Logger(OutboxListener.name);
  private client: Client | undefined;
  private pid: number | undefined;
  private handlers: OutboxListenerHandlers | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private failures = 0;
  private stopped = true;
  private connecting: Promise<void> | undefined;

  constructor(@Inject(OUTBOX_RELAY_OPTIONS) private readonly options: OutboxRelayOptions) {}

  /** Starts listening; a failure to connect is retried in the background, never thrown. */
  async start(handlers: OutboxListenerHandlers): Promise<void> {
    this.handlers = handlers;
    this.stopped = false;
    await this.connect();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.reconnectTimer);
    await this.connecting;
    const client = this.client;
    this.client = undefined;
    this.pid = undefined;
    if (client) await client.end().catch(() => undefined);
  }

  /** The server process of the LISTEN connection, while there is one (for operators and tests). */
  get backendPid(): number | undefined {
    return this.pid;
  }

  get listening(): boolean {
    return this.client !== undefined;
  }

  /**
   * Readiness: the LISTEN connection is up and answers. One that fails or
   * does not answer in time is dropped and opened again: a connection that
   * hangs without closing (a middlebox that stopped forwarding; keepalive
   * probes answered by a proxy never fail) would otherwise deliver no
   * notification again, and the relay would quietly fall back to polling.
   */
  async check(): Promise<void> {
    const client = this.client;
    if (!client) throw new Error(`not listening on ${OUTBOX_CHANNEL} (reconnecting)`);
    // A short-lived signal (one second, once per probe), so AbortSignal.timeout rather than a cleared timer.
    const timedOut = once(AbortSignal.timeout(CHECK_TIMEOUT_MS), 'abort').then(() => {
      throw new Error(`no answer to SELECT 1 within ${CHECK_TIMEOUT_MS} ms`);
    });
    try {
      // race() handles the loser's late rejection too.
      await Promise.race([client.query('SELECT 1'), timedOut]);
    } catch (err) {
      // end() in lost() destroys the socket while a query is outstanding, so a hung connection goes too.
      this.lost(client, new Error(`readiness check failed: ${err instanceof Error ? err.message : String(err)}`));
      throw err;
    }
  }

  private connect(): Promise<void> {
    this.connecting = this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async open(): Promise<void> {
    if (this.stopped) return;
    const client = new Client({
      connectionString: this.options.databaseUrl,
      application_name: 'relay-listen',
      keepAlive: true,
      keepAliveInitialDelayMillis: KEEPALIVE_IDLE_MS,
      connectionTimeoutMillis: 5000,
    });
    // Attached before connect: an 'error' event without a listener would crash the process.
    let ended = false;
    client.on('error', (err) => this.lost(client, err));
    client.on('end', () => {
      ended = true;
      this.lost(client);
    });
    client.on('notification', (n) => {
      if (n.channel === OUTBOX_CHANNEL && this.client === client) this.handlers?.onNotify();
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${OUTBOX_CHANNEL}`);
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      this.pid = rows[0].pid;
    } catch (err) {
      await client.end().catch(() => undefined);
      this.scheduleReconnect(err);
      return;
    }
    if (this.stopped) {
      await client.end().catch(() => undefined);
      return;
    }
    if (ended) {
      this.scheduleReconnect(new Error('connection ended while subscribing'));
      return;
    }
    if (this.failures > 0) this.logger.log(`listening on ${OUTBOX_CHANNEL} again`);
    this.failures = 0;
    this.client = client;
    this.handlers?.onListening();
  }

  private lost(client: Client, err?: Error): void {
    if (this.client !== client) return; // still connecting (open() handles it) or already replaced
    this.client = undefined;
    this.pid = undefined;
    client.end().catch(() => undefined);
    if (this.stopped) return;
    this.scheduleReconnect(err ?? new Error('connection ended'));
  }

  private scheduleReconnect(err: unknown): void {
    if (this.stopped) return;
    this.failures++;
    const delay = backoffDelay(this.failures - 1, RECONNECT_BACKOFF);
    this.logger.warn(
      `LISTEN ${OUTBOX_CHANNEL} connection lost (${err instanceof Error ? err.message : String(err)}); reconnecting in ${delay} ms`,
    );
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = setTimeout(() => void this.connect(), delay);
  }
}
