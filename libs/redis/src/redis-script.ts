import { Cluster } from 'ioredis';
import { createHash } from 'node:crypto';
import type { RedisClient } from './create-redis-client';

/**
 * How many replicas must hold a write before it is acknowledged, and how long
 * to wait for them (Redis's WAIT). None: the master's own acknowledgement.
 */
export interface Durability {
  readonly replicas: number;
  readonly timeoutMs: number;
}

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
  ) {
    super(
      `written, but ${acknowledged} of ${wanted} replica(s) acknowledged it within ${timeoutMs} ms`,
      cause === undefined ? undefined : { cause },
    );
    this.name = 'NotReplicatedError';
  }
}

type PipelineResult = [Error | null, unknown][] | null;

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
   * The script, then WAIT on the same connection in the same round trip (one
   * pipeline, which a cluster client sends to the master of the keys' slot):
   * resolves once `durability.replicas` replicas hold what the script wrote,
   * or throws NotReplicatedError (the write stands on the master). Without
   * durability, or with 0 replicas, it is `run`.
   */
  async runDurably<T = unknown>(
    client: RedisClient,
    keys: readonly string[],
    args: readonly ScriptArg[],
    durability: Durability | undefined,
  ): Promise<T> {
    if (!durability || durability.replicas <= 0) return this.run<T>(client, keys, args);
    const { replicas, timeoutMs } = durability;
    const send = (evalsha: boolean): Promise<PipelineResult> => {
      const pipeline = client.pipeline();
      if (evalsha) pipeline.evalsha(this.sha, keys.length, ...keys, ...args);
      else pipeline.eval(this.lua, keys.length, ...keys, ...args);
      return pipeline.call('WAIT', replicas, timeoutMs).exec();
    };
    let results = await send(true);
    // A cluster whose slot moved (a failover): the script was refused (MOVED, ASK) and WAIT failed otherwise, so
    // ioredis neither follows the redirect (it does only when every command of a pipeline got the same one) nor
    // learns the new owner. Nothing ran: learn the slots and send it once more.
    if (client instanceof Cluster && isRedirect(results?.[0]?.[0])) {
      await refreshSlots(client);
      results = await send(true);
    }
    if (results?.[0]?.[0]?.message.startsWith('NOSCRIPT')) results = await send(false);
    if (!results || results.length !== 2) throw new Error(`${this.name}: the pipeline was not answered`);
    const [[scriptError, value], [waitError, acknowledged]] = results;
    if (scriptError) throw scriptError;
    // The script ran; only its replication is unknown: the caller must be able to tell, and to undo.
    if (waitError) throw new NotReplicatedError(0, replicas, timeoutMs, value, waitError);
    if (Number(acknowledged) < replicas) throw new NotReplicatedError(Number(acknowledged), replicas, timeoutMs, value);
    return value as T;
  }
}

function isRedirect(err: Error | null | undefined): boolean {
  return !!err && /^(MOVED|ASK) /.test(err.message);
}

/** The cluster's slot map read again (CLUSTER SLOTS), resolved once the client has it. */
function refreshSlots(client: Cluster): Promise<void> {
  return new Promise((resolve) => client.refreshSlotsCache(() => resolve()));
}
