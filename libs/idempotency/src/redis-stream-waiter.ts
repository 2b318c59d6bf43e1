import type { RedisClient } from '@app/redis';
import type { Logger } from '@nestjs/common';

interface Waiter {
  readonly after: string;
  finish(news: boolean): void;
  fail(err: unknown): void;
}

/**
 * How long one XREAD blocks; waiters time out on their own timers. Short, as
 * it also bounds the one wait a join can miss: a CLIENT UNBLOCK that reaches
 * Redis before the XREAD it was meant for.
 */
const BLOCK_MS = 250;

/**
 * Tells waiters when a stream has entries after an id, through one blocking
 * connection for the whole process, however many wait: one XREAD BLOCK over
 * every stream someone waits on. A waiter that joins while the read blocks
 * interrupts it (CLIENT UNBLOCK), so the read starts again with its stream.
 */
export class RedisStreamWaiter {
  private readonly byStream = new Map<string, Set<Waiter>>();
  private blocking: RedisClient | undefined;
  private blockingId: number | undefined;
  private connecting: Promise<RedisClient> | undefined;
  private reading = false;
  /** The id each stream is read after by the XREAD in flight. */
  private readonly inFlight = new Map<string, string>();
  private blocked = false;
  private unblockSent = false;
  private closed = false;

  constructor(
    private readonly redis: RedisClient,
    private readonly makeBlocking: () => RedisClient,
    private readonly logger: Logger,
  ) {}

  /** Resolves true once `stream` has an entry after `after`, false after `timeoutMs` or an abort. */
  waitFor(stream: string, after: string, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
    if (this.closed) return Promise.reject(new Error('the stream waiter is closed'));
    return new Promise<boolean>((resolve, reject) => {
      let waiters = this.byStream.get(stream);
      if (!waiters) {
        waiters = new Set();
        this.byStream.set(stream, waiters);
      }
      const set = waiters;
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        set.delete(waiter);
        if (set.size === 0 && this.byStream.get(stream) === set) this.byStream.delete(stream);
      };
      const waiter: Waiter = {
        after,
        finish: (news) => {
          done();
          resolve(news);
        },
        fail: (err) => {
          done();
          reject(err instanceof Error ? err : new Error(String(err)));
        },
      };
      const onAbort = (): void => waiter.finish(false);
      const timer = setTimeout(() => waiter.finish(false), timeoutMs);
      signal.addEventListener('abort', onAbort, { once: true });
      set.add(waiter);
      // The read in flight covers this waiter only if it watches this stream from as early.
      const watched = this.inFlight.get(stream);
      if (watched === undefined || compareIds(after, watched) < 0) this.changed();
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    // Told there is nothing (yet): each follower then sees the store closing and lets go.
    for (const waiters of this.byStream.values()) for (const w of [...waiters]) w.finish(false);
    const client = this.blocking ?? (await this.connecting?.catch(() => undefined));
    client?.disconnect();
  }

  /** The set of streams changed: read, or read again with the new set. */
  private changed(): void {
    if (!this.reading) {
      this.reading = true;
      void this.readLoop();
      return;
    }
    if (this.blocked && !this.unblockSent && this.blockingId !== undefined) {
      this.unblockSent = true;
      this.redis.client('UNBLOCK', this.blockingId).catch(() => undefined);
    }
  }

  private async readLoop(): Promise<void> {
    try {
      while (this.byStream.size > 0 && !this.closed) {
        const client = await this.connection();
        const streams = [...this.byStream.keys()];
        const ids = streams.map((s) => earliest([...this.byStream.get(s)!].map((w) => w.after)));
        this.inFlight.clear();
        streams.forEach((s, i) => this.inFlight.set(s, ids[i]));
        this.blocked = true;
        this.unblockSent = false;
        let reply: [string, unknown[]][] | null;
        try {
          reply = await client.xread('COUNT', 1, 'BLOCK', BLOCK_MS, 'STREAMS', ...streams, ...ids);
        } finally {
          this.blocked = false;
          this.inFlight.clear();
        }
        for (const [stream] of reply ?? []) {
          for (const w of [...(this.byStream.get(stream) ?? [])]) w.finish(true);
        }
      }
    } catch (err) {
      if (!this.closed)
        this.logger.warn(`idempotency: waiting for frames failed: ${err instanceof Error ? err.message : String(err)}`);
      for (const waiters of this.byStream.values()) for (const w of [...waiters]) w.fail(err);
    } finally {
      this.reading = false;
      // A waiter may have come in as the loop was ending.
      if (this.byStream.size > 0 && !this.closed) this.changed();
    }
  }

  private async connection(): Promise<RedisClient> {
    if (this.blocking) return this.blocking;
    this.connecting ??= (async () => {
      const client = this.makeBlocking();
      client.on('error', () => undefined); // reported by the commands that fail
      client.on('ready', () => {
        // A reconnected client has a new id.
        client.client('ID').then(
          (id: unknown) => (this.blockingId = Number(id)),
          () => undefined,
        );
      });
      if (client.status === 'wait') await client.connect();
      this.blockingId = Number(await client.client('ID'));
      this.blocking = client;
      return client;
    })();
    try {
      return await this.connecting;
    } catch (err) {
      this.connecting = undefined;
      throw err;
    }
  }
}

/** The smallest of stream ids `ms-seq`. */
function earliest(ids: readonly string[]): string {
  let best = ids[0];
  for (const id of ids) if (compareIds(id, best) < 0) best = id;
  return best;
}

function compareIds(a: string, b: string): number {
  const [am, as = '0'] = a.split('-');
  const [bm, bs = '0'] = b.split('-');
  const ms = BigInt(am) - BigInt(bm);
  if (ms !== 0n) return ms < 0n ? -1 : 1;
  const seq = BigInt(as) - BigInt(bs);
  return seq === 0n ? 0 : seq < 0n ? -1 : 1;
}
