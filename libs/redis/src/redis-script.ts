import { backoffDelay } from '@app/config';
import { Cluster, type Redis, type RedisOptions } from 'ioredis';
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { RedisClient } from './create-redis-client';
import { decideDurableWrite, type DurableWriteFacts, type RefusalReason } from './durable-write-decision';
import { keySlot } from './partition-tags';
import type { MasterReplicas } from './master-replicas';

/**
 * How many replicas must hold a write before it is acknowledged, and how long
 * to wait for them (Redis's WAIT). None: the master's own acknowledgement.
 */
export type Durability = DurabilityWait & DurabilityOfMasters;

interface DurabilityWait {
  readonly replicas: number;
  readonly timeoutMs: number;
}

/**
 * What a write does on a master with no replica online (REDIS_DURABILITY); absent: `strict`, it is refused. And what
 * this process knows of its masters' replicas (a master without one is written without WAIT), and the count and log
 * of the writes accepted without one: required in `replica` mode, whose accepted writes must be counted; absent
 * otherwise, every write sends WAIT.
 */
type DurabilityOfMasters =
  | { readonly mode?: 'strict'; readonly masters?: MasterReplicas }
  | { readonly mode: 'replica'; readonly masters: MasterReplicas };

const REFUSALS: Record<RefusalReason, string> = {
  'not-confirmed': 'its master has a replica that did not confirm in time',
  'no-replica': 'its master has no replica online (REDIS_DURABILITY=strict)',
  unknown: "its master's replicas are unknown",
  'replica-returned': 'its master was written without waiting, and has a replica online again',
};

/**
 * The script ran on the master, but fewer replicas than asked confirmed it in
 * time: if the master dies now, the write may be lost with it. The caller
 * must not acknowledge what it wrote as durable.
 */
export class NotReplicatedError extends Error {
  constructor(
    readonly acknowledged: number,
    readonly wanted: number,
    readonly timeoutMs: number,
    /** What the script returned on the master: the caller may need it to undo or to go on. */
    readonly value?: unknown,
    /** Why WAIT gave no count, when it failed (a timeout, a closed connection) after the script ran. */
    cause?: unknown,
    /** Why the write was not taken as it stands. */
    readonly reason: RefusalReason = 'not-confirmed',
  ) {
    super(
      `written, but ${acknowledged} of ${wanted} replica(s) acknowledged it within ${timeoutMs} ms: ${REFUSALS[reason]}`,
      cause === undefined ? undefined : { cause },
    );
    this.name = 'NotReplicatedError';
  }
}

/** A script's argument: Lua strings are bytes, so a Buffer goes as its bytes (an answer that is not UTF-8). */
export type ScriptArg = string | number | Buffer;

/**
 * ioredis has every command's `...Buffer` form, but does not declare EVALSHA's and EVAL's. (Not `callBuffer`: with
 * auto-pipelining, which createRedisClient turns on, ioredis 6 drops the command's name from a `call` it pipelines.)
 */
interface BufferScripting {
  evalshaBuffer(sha: string, numkeys: number, ...args: ScriptArg[]): Promise<unknown>;
  evalBuffer(script: string, numkeys: number, ...args: ScriptArg[]): Promise<unknown>;
}

/**
 * A Lua script run with EVALSHA, falling back to EVAL once when the server has
 * not seen it (after a restart or failover): one round trip in the common case.
 */
export class RedisScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly lua: string,
  ) {
    this.sha = createHash('sha1').update(lua).digest('hex');
  }

  async run<T = unknown>(client: RedisClient, keys: readonly string[], args: readonly ScriptArg[]): Promise<T> {
    try {
      return (await client.evalsha(this.sha, keys.length, ...keys, ...args)) as T;
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err;
      return (await client.eval(this.lua, keys.length, ...keys, ...args)) as T;
    }
  }

  /**
   * `run`, with every string of the reply as a Buffer (integers stay numbers): for a reply that holds bytes
   * that may not be UTF-8 (a stored answer), read exactly and without decoding what is only passed on.
   */
  async runBuffer<T = unknown>(client: RedisClient, keys: readonly string[], args: readonly ScriptArg[]): Promise<T> {
    const buffered = client as unknown as BufferScripting;
    try {
      return (await buffered.evalshaBuffer(this.sha, keys.length, ...keys, ...args)) as T;
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err;
      return (await buffered.evalBuffer(this.lua, keys.length, ...keys, ...args)) as T;
    }
  }

  /**
   * The script, then WAIT and ROLE on the same connection in the same round
   * trip (one pipeline, which a cluster client sends to the master of the
   * keys' slot): resolves once `durability.replicas` replicas hold what the
   * script wrote, or, in mode `replica`, once the master says it has no
   * replica online (counted by `durability.masters`); otherwise throws
   * NotReplicatedError (the write stands on the master). A master known to
   * have no replica (a recent write found none) is sent the script and ROLE
   * only: WAIT would block its whole timeout there. Without durability, or
   * with 0 replicas, it is `run`.
   *
   * On a cluster it follows what a moving slot answers, which ioredis does not
   * for a pipeline whose other commands succeeded: MOVED (again to the node
   * named, now the slot's in the client's map, the map read again meanwhile),
   * ASK (to the node named, after ASKING, the map unchanged), TRYAGAIN (a
   * script whose keys a migration has split: again after a backoff, for a few
   * seconds). Each means the script did not run, so sending it again is safe.
   */
  async runDurably<T = unknown>(
    client: RedisClient,
    keys: readonly string[],
    args: readonly ScriptArg[],
    durability: Durability | undefined,
  ): Promise<T> {
    if (!durability || durability.replicas <= 0) return this.run<T>(client, keys, args);
    const { replicas, timeoutMs, masters } = durability;
    const slot = keySlot(keys[0] ?? '');
    const tryAgainUntil = performance.now() + TRY_AGAIN_BUDGET_MS;
    let askTarget: Redis | undefined;
    let evalsha = true;
    let hops = 0;
    let tryAgains = 0;
    for (;;) {
      const target = (): string | undefined => (askTarget ? nodeKeyOf(askTarget) : masterKeyOf(client, slot));
      let node = target();
      // WAIT blocks the connection it is sent on, shared by every command to that master: sent to a master with no
      // replica, each would hold the others up for its whole timeout, and a queue of them times out the lot. So a
      // master whose replicas are not known yet (just promoted, or idle a while) learns them from one write, while
      // the writes that come meanwhile wait for that one.
      let replicasKnown = node === undefined ? undefined : masters?.replicasOf(node);
      // A write that found nothing (its ROLE timed out too) leaves the next one to try: one at a time still. The
      // node is looked up again after each wait: a failover meanwhile moves the slot, and what the new master says
      // must not be kept under the old one's address.
      for (
        let learning = node === undefined ? undefined : masters?.learning(node);
        node !== undefined && replicasKnown === undefined && learning;
        learning = node === undefined ? undefined : masters?.learning(node)
      ) {
        await learning;
        node = target();
        replicasKnown = node === undefined ? undefined : masters?.replicasOf(node);
      }
      const waits = replicasKnown !== 'none';
      const sent = this.sendDurably(
        askTarget ?? client,
        askTarget !== undefined,
        evalsha,
        keys,
        args,
        waits ? [replicas, timeoutMs] : undefined,
      );
      if (node !== undefined && replicasKnown === undefined) masters?.learnFrom(node, sent);
      const [[scriptError, value], ...replies] = await sent;
      if (scriptError) {
        const [code, , to] = scriptError.message.split(' ');
        if (code === 'NOSCRIPT' && evalsha) {
          evalsha = false;
          continue;
        }
        if (!(client instanceof Cluster) || hops >= MAX_HOPS) throw scriptError;
        if (code === 'MOVED') {
          // The node answering names the slot's owner: sent there next, as ioredis does for one command. The slot map
          // read meanwhile may come from a node gossip has not told yet; a MOVED that keeps coming (two nodes that
          // each name the other) is sent again after a backoff, not 16 times in a few round trips.
          if (hops > 0) await sleep(backoffDelay(hops - 1, MOVED_BACKOFF));
          hops++;
          askTarget = undefined;
          if (to !== undefined) slotMovedTo(client, slot, to);
          client.refreshSlotsCache();
          continue;
        }
        if (code === 'ASK') {
          hops++;
          askTarget = nodeNamed(client, to);
          if (askTarget) continue;
          throw scriptError;
        }
        if (code === 'TRYAGAIN' && performance.now() < tryAgainUntil) {
          askTarget = undefined;
          await sleep(backoffDelay(tryAgains++, TRY_AGAIN_BACKOFF));
          continue;
        }
        throw scriptError;
      }
      const [waitError, waitReply] = waits ? replies[0] : [null, undefined];
      const [roleError, roleReply] = replies[waits ? 1 : 0];
      let acknowledged: DurableWriteFacts['acknowledged'] = !waits
        ? 'not-sent'
        : waitError
          ? 'failed'
          : Number(waitReply);
      const replicasOnline = roleError ? undefined : onlineReplicasOf(roleReply);
      if (node !== undefined && roleError?.message.startsWith('NOPERM')) masters?.roleDenied(node);
      else if (node !== undefined) masters?.observe(node, replicasOnline);
      const facts = { wanted: replicas, mode: durability.mode ?? 'strict', replicasOnline } as const;
      let decision = decideDurableWrite({ ...facts, acknowledged });
      if (decision.outcome === 'refused' && decision.reason === 'replica-returned') {
        // Sent without WAIT to a master that has a replica again: WAIT now, on the connection the script ran on,
        // covers it (WAIT counts every write that connection made), instead of refusing what may well be replicated.
        const ranOn =
          askTarget ?? (client instanceof Cluster && node !== undefined ? connectionTo(client, node) : client);
        acknowledged = await ranOn.wait(replicas, timeoutMs).then(Number, () => 'failed' as const);
        decision = decideDurableWrite({ ...facts, acknowledged });
      }
      if (decision.outcome === 'durable') return value as T;
      if (decision.outcome === 'unreplicated') {
        masters?.accepted(node ?? 'unknown');
        return value as T;
      }
      // The script ran; only its replication is unknown: the caller must be able to tell, and to undo.
      throw new NotReplicatedError(
        typeof acknowledged === 'number' ? acknowledged : 0,
        replicas,
        timeoutMs,
        value,
        waitError ?? undefined,
        decision.reason,
      );
    }
  }

  /** One round trip: [ASKING,] the script, [WAIT,] ROLE; the results of all but ASKING, each answered. */
  private async sendDurably(
    target: RedisClient,
    asking: boolean,
    evalsha: boolean,
    keys: readonly string[],
    args: readonly ScriptArg[],
    wait: readonly [replicas: number, timeoutMs: number] | undefined,
  ): Promise<[Error | null, unknown][]> {
    const pipeline = target.pipeline();
    // ASKING lets the next command alone reach a slot being imported; a pipeline is one write: nothing comes between.
    if (asking) pipeline.call('ASKING');
    if (evalsha) pipeline.evalsha(this.sha, keys.length, ...keys, ...args);
    else pipeline.eval(this.lua, keys.length, ...keys, ...args);
    if (wait) pipeline.call('WAIT', ...wait);
    pipeline.call('ROLE');
    const results = await pipeline.exec();
    const expected = (asking ? 1 : 0) + (wait ? 3 : 2);
    if (!results || results.length !== expected) throw new Error(`${this.name}: the pipeline was not answered`);
    return asking ? results.slice(1) : results;
  }
}

/** Redirections (MOVED, ASK) followed at most, as ioredis's own maxRedirections for one command. */
const MAX_HOPS = 16;
/**
 * TRYAGAIN: a migration has split the script's keys between two nodes; it ends when the slot is handed over, which
 * for a slot of a few thousand keys takes well under a second. Equal jitter: the retries of many requests spread out,
 * and none comes back at once.
 */
const TRY_AGAIN_BACKOFF = { baseMs: 20, capMs: 500, jitter: 'equal' } as const;
const TRY_AGAIN_BUDGET_MS = 5000;
/** MOVED again after following one: the nodes disagree until gossip settles (a few hundred ms); 16 hops cover ~3 s. */
const MOVED_BACKOFF = { baseMs: 10, capMs: 250, jitter: 'equal' } as const;

/** What ioredis's Cluster keeps private and does itself with a redirection of one command (cluster/index.js). */
interface ClusterInternals {
  readonly connectionPool: { findOrCreate(node: RedisOptions, readOnly?: boolean): Redis };
  natMapper(key: string): RedisOptions;
  readonly _groupsBySlot: (number | undefined)[];
  readonly _groupsIds: Record<string, number | undefined>;
}

/** The client's connection to `key` (`host:port` as the cluster names it, mapped by natMap), made if it has none. */
function connectionTo(client: Cluster, key: string): Redis {
  const internals = client as unknown as ClusterInternals;
  return internals.connectionPool.findOrCreate(internals.natMapper(key));
}

/** The slot map told that `slot` is on `key` now, as ioredis's MOVED handler does: the next send goes there. */
function slotMovedTo(client: Cluster, slot: number, key: string): void {
  const connection = connectionTo(client, key);
  const internals = client as unknown as ClusterInternals;
  client.slots[slot] = [nodeKeyOf(connection)];
  internals._groupsBySlot[slot] = internals._groupsIds[client.slots[slot].join(';')];
}

/** `host:port`, as a Cluster client names its nodes (its slot map, MOVED and ASK). */
function nodeKeyOf(node: Redis): string {
  return `${node.options.host}:${node.options.port}`;
}

/** The master the client would send the slot's commands to, as its slot map says (undefined before it has one). */
function masterKeyOf(client: RedisClient, slot: number): string | undefined {
  return client instanceof Cluster ? client.slots[slot]?.[0] : nodeKeyOf(client);
}

/**
 * The client's connection to the node an ASK named, made if it has none, as ioredis does for one command: the node
 * may be a master with no slot yet (added to the cluster, the first slot being moved onto it), which the slot map
 * (CLUSTER SLOTS) does not list and a read of it would not find.
 */
function nodeNamed(client: Cluster, key: string | undefined): Redis | undefined {
  return key === undefined ? undefined : connectionTo(client, key);
}

/** ROLE's replicas on a master: it lists only those online (synced and streaming). Unknown on anything else. */
function onlineReplicasOf(role: unknown): number | undefined {
  if (!Array.isArray(role) || role[0] !== 'master' || !Array.isArray(role[2])) return undefined;
  return role[2].length;
}
