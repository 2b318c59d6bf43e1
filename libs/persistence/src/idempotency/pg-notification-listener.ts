import { Logger } from '@nestjs/common';
import { Client, type ClientConfig } from 'pg';

/** Someone waiting for news on one topic (a notification payload). */
interface Subscriber {
  /** A notification came (or may have been lost) since the last `clear()`. */
  pending: boolean;
  wake: (() => void) | undefined;
}

export interface Subscription {
  /** Forget earlier news: call it before reading what the news is about. */
  clear(): void;
  /** True at once if news came since `clear()`, else when it comes; false after `timeoutMs` or an abort. */
  wait(timeoutMs: number, signal: AbortSignal): Promise<boolean>;
  unsubscribe(): void;
}

/**
 * LISTEN on one channel through one dedicated connection for the whole
 * store, however many wait (a pooled connection would be handed to other
 * queries and lose the subscription), and wakes the subscribers of each
 * payload. Made on first use; a lost connection wakes every subscriber (what
 * was sent meanwhile is lost, so they read again) and is made again by the
 * next subscriber. Subscribers read after subscribing, so a notification is
 * never needed for what was committed before.
 */
export class PgNotificationListener {
  private readonly logger = new Logger(PgNotificationListener.name);
  private readonly byTopic = new Map<string, Set<Subscriber>>();
  private client: Client | undefined;
  private connecting: Promise<void> | undefined;
  private closed = false;

  constructor(
    private readonly channel: string,
    private readonly config: () => ClientConfig,
  ) {}

  /** Subscribes to `topic` once LISTEN is in place; rejects when PostgreSQL cannot be reached. */
  async subscribe(topic: string): Promise<Subscription> {
    await this.listening();
    const subscriber: Subscriber = { pending: false, wake: undefined };
    let set = this.byTopic.get(topic);
    if (!set) {
      set = new Set();
      this.byTopic.set(topic, set);
    }
    set.add(subscriber);
    const subscribers = set;
    return {
      clear: () => {
        subscriber.pending = false;
      },
      wait: (timeoutMs, signal) => {
        if (subscriber.pending || signal.aborted) return Promise.resolve(subscriber.pending);
        // A follower that waits on a listener that lost its connection polls meanwhile; the next one reconnects.
        if (!this.client && !this.closed) this.listening().catch(() => undefined);
        return new Promise<boolean>((resolve) => {
          const done = (): void => {
            clearTimeout(timer);
            signal.removeEventListener('abort', done);
            subscriber.wake = undefined;
            resolve(subscriber.pending);
          };
          const timer = setTimeout(done, timeoutMs);
          signal.addEventListener('abort', done, { once: true });
          subscriber.wake = done;
        });
      },
      unsubscribe: () => {
        subscriber.wake?.();
        subscribers.delete(subscriber);
        if (subscribers.size === 0 && this.byTopic.get(topic) === subscribers) this.byTopic.delete(topic);
      },
    };
  }

  /** The LISTEN connection's server process, while there is one (for tests and operators). */
  async backendPid(): Promise<number | undefined> {
    const { rows } = (await this.client?.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')) ?? { rows: [] };
    return rows[0]?.pid;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.connecting?.catch(() => undefined);
    const client = this.client;
    this.client = undefined;
    this.wakeAll();
    await client?.end().catch(() => undefined);
  }

  private listening(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('the idempotency store is closed'));
    if (this.client) return Promise.resolve();
    this.connecting ??= this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async open(): Promise<void> {
    const client = new Client(this.config());
    // Attached before connect: an 'error' event without a listener would crash the process.
    client.on('error', (err) => this.lost(client, err));
    client.on('end', () => this.lost(client));
    client.on('notification', (n) => {
      if (n.channel !== this.channel || this.client !== client || n.payload === undefined) return;
      for (const s of this.byTopic.get(n.payload) ?? []) {
        s.pending = true;
        s.wake?.();
      }
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${this.channel}`);
    } catch (err) {
      await client.end().catch(() => undefined);
      throw err;
    }
    if (this.closed) {
      await client.end().catch(() => undefined);
      throw new Error('the idempotency store is closed');
    }
    this.client = client;
    // Anything sent before LISTEN took effect was missed by whoever waits already.
    this.wakeAll();
  }

  private lost(client: Client, err?: Error): void {
    if (this.client !== client) return;
    this.client = undefined;
    client.end().catch(() => undefined);
    if (!this.closed)
      this.logger.warn(
        `LISTEN ${this.channel} connection lost (${err?.message ?? 'ended'}); followers poll until it is back`,
      );
    this.wakeAll();
  }

  private wakeAll(): void {
    for (const set of this.byTopic.values()) {
      for (const s of set) {
        s.pending = true;
        s.wake?.();
      }
    }
  }
}
