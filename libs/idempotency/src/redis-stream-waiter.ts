import { keySlot, type RedisClient } from '@app/redis';
import type { Logger } from '@nestjs/common';
import { Cluster, type Redis } from 'ioredis';

/** Tells waiters when a stream has entries after an id. */
export interface StreamWaiter {
  /** Resolves true once `stream` has an entry after `after`, false after `timeoutMs` or an abort. */
  waitFor(stream: string, after: string, timeoutMs: number, signal: AbortSignal): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * The waiter for a client: on one Redis, one blocking read for the whole
 * process; on a Redis Cluster, one read loop per master (ClusterStreamWaiter).
 */
export function createStreamWaiter(redis: RedisClient, makeBlocking: () => RedisClient, logger: Logger): StreamWaiter {
  return redis instanceof Cluster
    ? new ClusterStreamWaiter(redis, makeBlocking, logger)
    : new RedisStreamWaiter(redis, makeBlocking, logger);
}

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
export class RedisStreamWaiter implements StreamWaiter {
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
    const news = addWaiter(this.byStream, stream, after, timeoutMs, signal, 'reject');
    // The read in flight covers this waiter only if it watches this stream from as early.
    const watched = this.inFlight.get(stream);
    if (watched === undefined || compareIds(after, watched) < 0) this.changed();
    return news;
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

/**
 * Adds a waiter for news on `stream` to `byStream`, which resolves true on news and false after `timeoutMs` or an
 * abort, and takes itself out however it ends. A failed read rejects it, or (`as no news`) resolves it false: the
 * follower then asks the record itself.
 */
function addWaiter(
  byStream: Map<string, Set<Waiter>>,
  stream: string,
  after: string,
  timeoutMs: number,
  signal: AbortSignal,
  failures: 'reject' | 'as no news',
): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => {
    let set = byStream.get(stream);
    if (!set) {
      set = new Set();
      byStream.set(stream, set);
    }
    const waiters = set;
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      waiters.delete(waiter);
      if (waiters.size === 0 && byStream.get(stream) === waiters) byStream.delete(stream);
    };
    const waiter: Waiter = {
      after,
      finish: (news) => {
        done();
        resolve(news);
      },
      fail: (err) => {
        done();
        if (failures === 'reject') reject(err instanceof Error ? err : new Error(String(err)));
        else resolve(false);
      },
    };
    const onAbort = (): void => waiter.finish(false);
    const timer = setTimeout(() => waiter.finish(false), timeoutMs);
    signal.addEventListener('abort', onAbort, { once: true });
    waiters.add(waiter);
  });
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

/** How long a cluster read loop rests between non-blocking reads of several slots, and after an error. */
const POLL_MS = 50;
const RETRY_MS = 200;

/** The read loop of one master: the streams of the slots it serves. */
interface MasterReader {
  /** `host:port`, as the Cluster client names its nodes. */
  readonly node: string;
  reading: boolean;
  /** The id each stream is read after by the read in flight. */
  readonly inFlight: Map<string, string>;
  /** The XREAD BLOCK in flight, on the connection with this CLIENT ID, if one is. */
  blockedId: number | undefined;
  unblockSent: boolean;
  /** Ends the rest between two polls, when one is taken. */
  wake: (() => void) | undefined;
}

const nodeKeyOf = (node: Redis): string => `${node.options.host}:${node.options.port}`;

/**
 * The same on a Redis Cluster, where one XREAD may name only keys of one slot
 * (CROSSSLOT otherwise) and CLIENT ID / UNBLOCK must reach the node that
 * blocks. The streams waited on are grouped by the master that serves their
 * slot, as the blocking client's slot map says, with one read loop per master
 * on that client's own connection to it (not pipelined; used for nothing
 * else). A loop whose streams are all of one slot (the usual case: one
 * followed request, or many followers of one) blocks in XREAD as on one
 * Redis, interrupted by CLIENT UNBLOCK sent to the same master; streams of
 * several slots on one master are read without blocking, one XREAD per slot
 * in one pipeline, every POLL_MS, interrupted as well when a waiter joins.
 *
 * A failed read (MOVED after a failover, a master that died, CLUSTERDOWN)
 * refreshes the slot map and groups the streams again; it fails no waiter.
 * Each waiter still ends on its own timer, and the follower then asks the
 * record itself through the shared client, which does fail when the cluster
 * cannot answer: a follower never waits longer than on one Redis.
 */
export class ClusterStreamWaiter implements StreamWaiter {
  private readonly byStream = new Map<string, Set<Waiter>>();
  private readonly readers = new Map<string, MasterReader>();
  private blocking: Cluster | undefined;
  private connecting: Promise<Cluster> | undefined;
  private refreshing: Promise<void> | undefined;
  private retrying = false;
  private closed = false;

  constructor(
    private readonly redis: Cluster,
    private readonly makeBlocking: () => RedisClient,
    private readonly logger: Logger,
  ) {}

  waitFor(stream: string, after: string, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
    if (this.closed) return Promise.reject(new Error('the stream waiter is closed'));
    const news = addWaiter(this.byStream, stream, after, timeoutMs, signal, 'as no news');
    this.schedule();
    return news;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const waiters of this.byStream.values()) for (const w of [...waiters]) w.finish(false);
    for (const reader of this.readers.values()) reader.wake?.();
    const client = this.blocking ?? (await this.connecting?.catch(() => undefined));
    client?.disconnect();
  }

  /** Makes every stream's master read it, from as early as its earliest waiter asks. */
  private schedule(): void {
    if (this.closed || this.byStream.size === 0) return;
    const cluster = this.blocking;
    if (cluster === undefined) {
      this.connection().then(
        () => this.schedule(),
        (err: unknown) => this.retryLater(err),
      );
      return;
    }
    for (const [stream, waiters] of this.byStream) {
      const node = this.masterOf(cluster, stream);
      if (node === undefined) {
        this.retryLater(new Error(`no master known for the slot of ${stream}`));
        continue;
      }
      let reader = this.readers.get(node);
      if (reader === undefined) {
        reader = {
          node,
          reading: false,
          inFlight: new Map(),
          blockedId: undefined,
          unblockSent: false,
          wake: undefined,
        };
        this.readers.set(node, reader);
      }
      if (!reader.reading) {
        reader.reading = true;
        void this.readLoop(reader);
        continue;
      }
      const watched = reader.inFlight.get(stream);
      if (watched === undefined || compareIds(earliest([...waiters].map((w) => w.after)), watched) < 0)
        this.interrupt(reader);
    }
  }

  /** Ends the read in flight early, so that the loop reads again with the new set. */
  private interrupt(reader: MasterReader): void {
    reader.wake?.();
    if (reader.blockedId === undefined || reader.unblockSent) return;
    // The shared client's connection to the same master: CLIENT UNBLOCK acts only on the node it is sent to.
    const node = this.redis.nodes('master').find((n) => nodeKeyOf(n) === reader.node);
    if (node === undefined) return; // the block ends on its own within BLOCK_MS
    reader.unblockSent = true;
    node.client('UNBLOCK', reader.blockedId).catch(() => undefined);
  }

  private async readLoop(reader: MasterReader): Promise<void> {
    try {
      while (!this.closed) {
        const cluster = await this.connection();
        const bySlot = new Map<number, string[]>();
        for (const stream of this.byStream.keys()) {
          if (this.masterOf(cluster, stream) !== reader.node) continue;
          const slot = keySlot(stream);
          bySlot.set(slot, [...(bySlot.get(slot) ?? []), stream]);
        }
        if (bySlot.size === 0) return;
        const node = cluster.nodes('master').find((n) => nodeKeyOf(n) === reader.node);
        try {
          if (node === undefined) throw new Error(`no connection to master ${reader.node}`);
          const reads = [...bySlot.values()].map((streams) => ({
            streams,
            ids: streams.map((s) => earliest([...this.byStream.get(s)!].map((w) => w.after))),
          }));
          reader.inFlight.clear();
          for (const { streams, ids } of reads) streams.forEach((s, i) => reader.inFlight.set(s, ids[i]));
          let replies: ([string, unknown[]][] | null)[];
          if (reads.length === 1) {
            const [{ streams, ids }] = reads;
            const id = Number(await node.client('ID'));
            reader.unblockSent = false;
            reader.blockedId = id;
            try {
              replies = [await node.xread('COUNT', 1, 'BLOCK', BLOCK_MS, 'STREAMS', ...streams, ...ids)];
            } finally {
              reader.blockedId = undefined;
            }
          } else {
            const pipeline = node.pipeline();
            for (const { streams, ids } of reads) pipeline.xread('COUNT', 1, 'STREAMS', ...streams, ...ids);
            const results = (await pipeline.exec()) ?? [];
            const failed = results.find(([err]) => err)?.[0];
            if (failed) throw failed;
            replies = results.map(([, reply]) => reply as [string, unknown[]][] | null);
          }
          reader.inFlight.clear();
          let news = false;
          for (const reply of replies)
            for (const [stream] of reply ?? []) {
              news = true;
              for (const w of [...(this.byStream.get(stream) ?? [])]) w.finish(true);
            }
          if (reads.length > 1 && !news) await this.rest(reader, POLL_MS);
        } catch (err) {
          reader.inFlight.clear();
          if (this.closed) return;
          // The streams may have moved: read the slot map again, then group them again.
          this.logger.debug(
            `idempotency: waiting for frames on ${reader.node} failed: ${err instanceof Error ? err.message : String(err)}`,
          );
          await this.refreshSlots(cluster);
          await this.rest(reader, RETRY_MS);
          // Streams that another master serves now get its loop; this one reads what is left.
          this.schedule();
        }
      }
    } catch (err) {
      // Only connecting can fail here; the waiters end on their timers.
      this.retryLater(err);
    } finally {
      reader.reading = false;
      // A waiter may have come in as the loop was ending.
      this.schedule();
    }
  }

  private rest(reader: MasterReader, ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        reader.wake = undefined;
        resolve();
      }
      reader.wake = done;
    });
  }

  /** Waits RETRY_MS and schedules again: the cluster is connecting, or its slot map is behind. */
  private retryLater(err: unknown): void {
    this.logger.debug(`idempotency: frames waiter: ${err instanceof Error ? err.message : String(err)}`);
    if (this.retrying) return;
    this.retrying = true;
    setTimeout(() => {
      this.retrying = false;
      const cluster = this.blocking;
      void (cluster ? this.refreshSlots(cluster) : Promise.resolve()).then(() => this.schedule());
    }, RETRY_MS).unref();
  }

  private masterOf(cluster: Cluster, stream: string): string | undefined {
    return cluster.slots[keySlot(stream)]?.[0];
  }

  private refreshSlots(cluster: Cluster): Promise<void> {
    this.refreshing ??= new Promise<void>((resolve) => cluster.refreshSlotsCache(() => resolve())).finally(() => {
      this.refreshing = undefined;
    });
    return this.refreshing;
  }

  private async connection(): Promise<Cluster> {
    if (this.blocking) return this.blocking;
    this.connecting ??= (async () => {
      const client = this.makeBlocking();
      if (!(client instanceof Cluster)) throw new Error('the blocking client of a Redis Cluster must be a Cluster');
      client.on('error', () => undefined); // reported by the reads that fail
      if (client.status === 'wait') await client.connect();
      else if (client.status !== 'ready') await new Promise((resolve) => client.once('ready', resolve));
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
