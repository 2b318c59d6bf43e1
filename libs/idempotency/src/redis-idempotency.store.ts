import { Logger } from '@nestjs/common';
import {
  connectionNameOf,
  duplicateForBlocking,
  type Durability,
  hashTagFor,
  NotReplicatedError,
  RedisScript,
  type RedisClient,
} from '@app/redis';
import type {
  ClaimResult,
  FrameEvent,
  FramesRef,
  IdempotencyFrameLog,
  IdempotencyStore,
  PeekResult,
  StoredHead,
  StoredResponse,
} from './idempotency-store.interface';
import { Cluster } from 'ioredis';
import { createStreamWaiter, type StreamWaiter } from './redis-stream-waiter';
import { bytesOf } from './streamed-answer';

/*
 * A record is a hash under `idem:<key>` (R):
 *   running:   state=running   token=<random>  fp=<sha256>  started=<ms>  [head=<json>]   TTL = lock TTL
 *   completed: state=completed status headers body fp [frames=<F>]                       TTL = result TTL
 * `body` and each frame's `d` are the answer's bytes as they were sent (Lua
 * strings are bytes: a NUL or invalid UTF-8 is kept); the rest is text.
 * A completed record has no token, so no stale token can match it. `started`
 * and the `now` returned with a running record are both Redis's clock, so how
 * long a request has run is known alike on every api instance.
 *
 * A running request's frames are a stream F = `{R}:f:<token>`, one per
 * attempt, so the frames of an attempt that was freed never mix with the
 * next one's. Its braces are a Redis Cluster hash tag naming R itself: R and
 * F share a slot, and one script may touch both (on a cluster, an R with a
 * `}` of its own needs another form: clusterFramesKey). Entries, in order:
 *   w=1           a follower waits (so that however the request ends, it writes an end marker here)
 *   h=<head json> the answer starts streaming
 *   d=<frame>     one frame
 *   e=completed | aborted
 * F lives as long as the lock (renewals extend both), then as long as the
 * result once completed, and a minute once aborted, for its followers to read
 * the end.
 */
const ABORTED_FRAMES_TTL_MS = 60_000;
const PAGE = 256;

/** A field of CLAIM's reply: Buffers by runBuffer, strings through runDurably's pipeline; PTTL and now are numbers. */
type Field = string | Buffer | number;
/** `['claimed']`, or `['existing', pttl, now, field, value, ...]`. */
type ClaimReply = [string | Buffer, ...Field[]];

const CLAIM = new RedisScript(
  'idempotency-claim',
  `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local rec = redis.call('HGETALL', KEYS[1])
if #rec == 0 then
  redis.call('HSET', KEYS[1], 'state', 'running', 'token', ARGV[1], 'fp', ARGV[2], 'started', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
-- Our own claim, made by this very call's first send: the connection closed after the script ran and ioredis sent
-- the pipeline again. The token is this attempt's alone, and the answer must be the first one's.
if redis.call('HGET', KEYS[1], 'state') == 'running' and redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  return {'claimed'}
end
return {'existing', redis.call('PTTL', KEYS[1]), now, unpack(rec)}`,
);

/** The record as a claim would see it, taking nothing (peek). */
const PEEK = new RedisScript(
  'idempotency-peek',
  `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local rec = redis.call('HGETALL', KEYS[1])
if #rec == 0 then return {'absent'} end
return {'existing', redis.call('PTTL', KEYS[1]), now, unpack(rec)}`,
);

/**
 * A completion sent again (ioredis resends a pipeline whose every reply the closed connection lost, though the script
 * ran): the record is completed by this very attempt (`by`, its token) with the same answer, so the reply is the first
 * send's, success, and nothing is written twice (no second end marker). Another answer from the same holder is not a
 * resend: refused, as before. ARGV[1]: token; `fields` are compared with `values` (Lua expressions).
 */
function alreadyCompleted(fields: readonly string[], values: readonly string[]): string {
  const read = ['state', 'by', ...fields].map((f) => `'${f}'`).join(', ');
  const same = values.map((v, i) => ` and done[${i + 3}] == ${v}`).join('');
  return `local done = redis.call('HMGET', KEYS[1], ${read})
if done[1] == 'completed' and done[2] == ARGV[1]${same} then return 1 end`;
}

/** KEYS: R, F. The end marker goes to F only if someone follows (F exists). */
const COMPLETE = new RedisScript(
  'idempotency-complete',
  `${alreadyCompleted(['fp', 'status', 'headers', 'body'], ['ARGV[2]', 'ARGV[3]', 'ARGV[4]', 'ARGV[5]'])}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'completed', 'fp', ARGV[2], 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5],
  'by', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('XADD', KEYS[2], '*', 'e', 'completed')
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
return 1`,
);

const RELEASE = new RedisScript(
  'idempotency-release',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('XADD', KEYS[2], '*', 'e', 'aborted')
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1`,
);

const RENEW = new RedisScript(
  'idempotency-renew',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1`,
);

const BEGIN_FRAMES = new RedisScript(
  'idempotency-frames-begin',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'head', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'h', ARGV[2])
redis.call('PEXPIRE', KEYS[2], math.max(1, redis.call('PTTL', KEYS[1])))
return 1`,
);

const APPEND_FRAMES = new RedisScript(
  'idempotency-frames-append',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('XADD', KEYS[2], '*', 'd', ARGV[i]) end
return 1`,
);

const COMPLETE_FRAMES = new RedisScript(
  'idempotency-frames-complete',
  `${alreadyCompleted(['fp', 'frames'], ['ARGV[2]', 'KEYS[2]'])}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
for i = 4, #ARGV do redis.call('XADD', KEYS[2], '*', 'd', ARGV[i]) end
local head = cjson.decode(redis.call('HGET', KEYS[1], 'head') or '{}')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'completed', 'fp', ARGV[2], 'status', head.status or 200,
  'headers', cjson.encode(head.headers or {}), 'body', '', 'frames', KEYS[2], 'by', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[2], '*', 'e', 'completed')
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1`,
);

/**
 * A follower registers: while the request runs, a waiter entry makes F exist,
 * so the request's end (however it ends) is written there. Returns 'live' or
 * 'frames' (F exists: read it to its end), or 'gone' (no such request, and
 * no frames: claim again).
 */
const WATCH = new RedisScript(
  'idempotency-frames-watch',
  `if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('XADD', KEYS[2], '*', 'w', '1')
    redis.call('PEXPIRE', KEYS[2], math.max(1, redis.call('PTTL', KEYS[1])))
  end
  return 'live'
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'frames' end
return 'gone'`,
);

export interface RedisIdempotencyStoreOptions {
  /** Prefix of every record's key. */
  readonly prefix?: string;
  /**
   * The one connection of this process that blocks waiting for frames, made
   * on first use (default: a duplicate of the client). Closed by `close()`.
   */
  readonly blockingClient?: () => RedisClient;
  /** How long a follower waits for news before it checks that the request is still alive. */
  readonly idleCheckMs?: number;
  /**
   * What a claim and a stored answer wait for (RedisModule's REDIS_DURABILITY: one replica on a cluster). A
   * claim no replica confirmed is freed and fails (the request answers 503): a lost lock would let a duplicate
   * run beside it. An answer no replica confirmed stands on the master and is logged: the effect is done, and a
   * retry after losing that master runs again (the summaries route's job id makes that run once).
   */
  readonly durability?: Durability;
}

export class RedisIdempotencyStore implements IdempotencyStore {
  private readonly logger = new Logger(RedisIdempotencyStore.name);
  private readonly prefix: string;
  private readonly durability: Durability | undefined;
  private readonly clustered: boolean;
  readonly frames: RedisFrameLog;

  constructor(
    private readonly redis: RedisClient,
    options: RedisIdempotencyStoreOptions | string = {},
  ) {
    const opts = typeof options === 'string' ? { prefix: options } : options;
    this.prefix = opts.prefix ?? 'idem:';
    this.durability = opts.durability;
    this.clustered = redis instanceof Cluster;
    const blockingClient =
      opts.blockingClient ??
      // It blocks (XREAD BLOCK): nothing may be batched behind it.
      (() => duplicateForBlocking(redis, { connectionName: `${connectionNameOf(redis) ?? 'idempotency'}:frames` }));
    this.frames = new RedisFrameLog(
      redis,
      (key) => this.recordKey(key),
      (record, token) => this.framesKey(record, token),
      blockingClient,
      opts.idleCheckMs ?? 1000,
      opts.durability,
    );
  }

  /**
   * `idem:<key>`. On a cluster only, a name with a brace anywhere is kept as
   * `idem:{<tag>}:<key>`, the tag a hash of the whole name (hashTagFor): the
   * client's braces would otherwise choose the record's slot (`{summaries}-…`
   * puts it beside the job stream), and a `}` without a tag would leave no
   * frames key the record's slot. A name without braces hashes whole, as it
   * always did: the client decides its slot no more than ours (both are
   * public functions of the name), and an upgrade renames no ordinary record
   * while old and new pods share keys. On one Redis, every name stays as it was.
   */
  private recordKey(key: string): string {
    const plain = this.prefix + key;
    if (!this.clustered || !/[{}]/.test(plain)) return plain;
    return `${this.prefix}{${hashTagFor(plain)}}:${key}`;
  }

  private framesKey(record: string, token: string): string {
    return this.clustered ? clusterFramesKey(record, token) : framesKey(record, token);
  }

  async claim(key: string, token: string, fingerprint: string, lockTtlMs: number): Promise<ClaimResult> {
    const durable = (this.durability?.replicas ?? 0) > 0;
    let reply: ClaimReply;
    if (!durable) {
      // One round trip, the reply as bytes: a completed answer's body is replayed as it was stored, not decoded.
      reply = await CLAIM.runBuffer<ClaimReply>(this.redis, [this.recordKey(key)], [token, fingerprint, lockTtlMs]);
    } else {
      try {
        reply = await CLAIM.runDurably<ClaimReply>(
          this.redis,
          [this.recordKey(key)],
          [token, fingerprint, lockTtlMs],
          this.durability,
        );
      } catch (err) {
        if (!(err instanceof NotReplicatedError)) throw err;
        const written = String((err.value as ClaimReply | undefined)?.[0]) === 'claimed';
        // Ours, but not on a replica: free it before failing, so the retry is not told the key is in progress.
        if (written) await this.release(key, token).catch(() => undefined);
        if (written) throw err;
        reply = err.value as ClaimReply; // read only: nothing of ours to lose
      }
    }
    if (String(reply[0]) === 'claimed') return { outcome: 'claimed' };
    return this.existing(reply, key, lockTtlMs, () => this.claim(key, token, fingerprint, lockTtlMs));
  }

  async peek(key: string): Promise<PeekResult> {
    // Read as bytes: a completed answer's body is what was stored, not decoded.
    const reply = await PEEK.runBuffer<ClaimReply>(this.redis, [this.recordKey(key)], []);
    if (String(reply[0]) === 'absent') return { outcome: 'absent' };
    return this.existing(reply, key, 0, () => this.peek(key));
  }

  /** A record another request holds or completed, from a claim's or a peek's reply (`existing`, PTTL, now, fields). */
  private async existing<T extends ClaimResult | PeekResult>(
    reply: ClaimReply,
    key: string,
    lockTtlMs: number,
    again: () => Promise<T>,
  ): Promise<T | Exclude<ClaimResult, { readonly outcome: 'claimed' }>> {
    const pttl = Number(reply[1]);
    const now = Number(reply[2]);
    let record = new Map<string, Field>();
    for (let i = 3; i < reply.length; i += 2) record.set(String(reply[i]), reply[i + 1]);
    if (record.get('state')?.toString() === 'completed') {
      // The durable claim (a pipeline with WAIT) comes back decoded as UTF-8, which is exact for every body
      // that is UTF-8. One that is not came back with U+FFFD in its place: the whole record is read again, as
      // bytes, in one read, and that read alone is the answer: the record the claim saw may have expired and
      // been replaced meanwhile, and a head of one answer with the body of another must never be replayed.
      const body = record.get('body');
      if (typeof body === 'string' && body.includes('\uFFFD')) {
        const whole = await this.redis.hgetallBuffer(this.recordKey(key));
        if (whole.state?.toString() !== 'completed') return again();
        record = new Map(Object.entries(whole));
      }
      const frames = record.get('frames')?.toString();
      return {
        outcome: 'completed',
        fingerprint: record.get('fp')?.toString() ?? '',
        response: {
          status: Number(record.get('status')?.toString()),
          headers: JSON.parse(record.get('headers')?.toString() ?? '{}') as Record<string, string>,
          body: bytesOfField(record.get('body')),
          ...(frames ? { frames: frames as FramesRef } : {}),
        },
      };
    }
    const fp = record.get('fp')?.toString() ?? '';
    // A record written before `started` existed has run for an unknown time: 0.
    const started = Number(record.get('started')?.toString() ?? now);
    const holder = record.get('token')?.toString();
    return {
      outcome: 'in-progress',
      fingerprint: fp,
      runningForMs: Math.max(0, now - started),
      expiresInMs: pttl > 0 ? pttl : lockTtlMs,
      ...(holder ? { frames: this.framesKey(this.recordKey(key), holder) as FramesRef } : {}),
    };
  }

  async complete(
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean> {
    const r = this.recordKey(key);
    const ok = await stored(
      COMPLETE.runDurably<number>(
        this.redis,
        [r, this.framesKey(r, token)],
        [
          token,
          fingerprint,
          response.status,
          JSON.stringify(response.headers),
          response.body,
          resultTtlMs,
          ABORTED_FRAMES_TTL_MS,
        ],
        this.durability,
      ),
      this.logger,
    );
    return ok === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    const r = this.recordKey(key);
    const keys = [r, this.framesKey(r, token)];
    return (await RELEASE.run<number>(this.redis, keys, [token, ABORTED_FRAMES_TTL_MS])) === 1;
  }

  async renew(key: string, token: string, lockTtlMs: number): Promise<boolean> {
    const r = this.recordKey(key);
    return (await RENEW.run<number>(this.redis, [r, this.framesKey(r, token)], [token, lockTtlMs])) === 1;
  }

  /** Closes the frame log's blocking connection, if one was made. */
  close(): Promise<void> {
    return this.frames.close();
  }
}

/**
 * A stored answer's write: one no replica confirmed stands on the master (the answer is right, the effect done),
 * so it counts as stored, with a warning: if that master is lost now, a retry runs the request again.
 */
async function stored(write: Promise<number>, logger: Logger): Promise<number> {
  try {
    return await write;
  } catch (err) {
    // The key itself stays out of the log (it is the client's); the request's log line names the request.
    if (!(err instanceof NotReplicatedError)) throw err;
    logger.warn(`a stored idempotent answer is on its master only: ${err.message}`);
    return Number(err.value);
  }
}

function bytesOfField(value: Field | undefined): Buffer {
  return Buffer.isBuffer(value) ? value : Buffer.from(String(value ?? ''), 'utf8');
}

function framesKey(recordKey: string, token: string): string {
  return `{${recordKey}}:f:${token}`;
}

/** The hash tag Redis Cluster hashes a key by: between its first `{` and the next `}`, if not empty. */
function hashTagOf(key: string): string | undefined {
  const open = key.indexOf('{');
  if (open < 0) return undefined;
  const close = key.indexOf('}', open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : undefined;
}

/**
 * On a cluster, F must hash like R. `{R}:f:<token>` does while R has no `}`:
 * R then has no hash tag and hashes whole, and F's tag is all of R. An R with
 * a `}` has a hash tag (recordKey sees to it), and F takes that tag, with R
 * length-prefixed after it for parseRef: `{<tag>}:r:<R's length>:<R>:<token>`.
 */
function clusterFramesKey(recordKey: string, token: string): string {
  if (!recordKey.includes('}')) return framesKey(recordKey, token);
  const tag = hashTagOf(recordKey);
  if (tag === undefined) throw new Error('a record key with a } needs a hash tag on a cluster');
  return `{${tag}}:r:${recordKey.length}:${recordKey}:${token}`;
}

/** The frames of RedisIdempotencyStore's records: a stream per attempt, followed through one blocking connection. */
export class RedisFrameLog implements IdempotencyFrameLog {
  private readonly logger = new Logger(RedisFrameLog.name);
  private waiter: StreamWaiter | undefined;
  private closed = false;

  constructor(
    private readonly redis: RedisClient,
    private readonly recordKey: (key: string) => string,
    private readonly framesKey: (record: string, token: string) => string,
    private readonly blockingClient: () => RedisClient,
    private readonly idleCheckMs: number,
    private readonly durability?: Durability,
  ) {}

  async begin(key: string, token: string, head: StoredHead): Promise<boolean> {
    const r = this.recordKey(key);
    const json = JSON.stringify({
      status: head.status,
      headers: head.headers,
      ...(head.storable === false ? { storable: false } : {}),
    });
    return (await BEGIN_FRAMES.run<number>(this.redis, [r, this.framesKey(r, token)], [token, json])) === 1;
  }

  async append(key: string, token: string, frames: readonly (Uint8Array | string)[]): Promise<boolean> {
    if (frames.length === 0) return true;
    const r = this.recordKey(key);
    const data = frames.map(bytesOf);
    return (await APPEND_FRAMES.run<number>(this.redis, [r, this.framesKey(r, token)], [token, ...data])) === 1;
  }

  complete(key: string, token: string, fingerprint: string, resultTtlMs: number): Promise<boolean> {
    return this.completeWith(key, token, fingerprint, resultTtlMs, []);
  }

  async completeWith(
    key: string,
    token: string,
    fingerprint: string,
    resultTtlMs: number,
    frames: readonly (Uint8Array | string)[],
  ): Promise<boolean> {
    const r = this.recordKey(key);
    const ok = await stored(
      COMPLETE_FRAMES.runDurably<number>(
        this.redis,
        [r, this.framesKey(r, token)],
        [token, fingerprint, resultTtlMs, ...frames.map(bytesOf)],
        this.durability,
      ),
      this.logger,
    );
    return ok === 1;
  }

  async *follow(ref: FramesRef, signal: AbortSignal): AsyncIterable<FrameEvent> {
    const { record, token } = parseRef(ref);
    let watched = false;
    let after = '-';
    while (!signal.aborted) {
      // As bytes: a frame is replayed exactly as it was appended, UTF-8 or not.
      const entries = (await this.redis.xrangeBuffer(ref, after, '+', 'COUNT', PAGE)) as [Buffer, Buffer[]][];
      for (const [id, fields] of entries) {
        after = `(${id.toString()}`;
        const event = toEvent(fields);
        if (event === undefined) continue;
        yield event;
        if (event.kind === 'end') return;
      }
      if (entries.length === PAGE) continue;
      if (!watched) {
        // Registered once caught up; what was written meanwhile is read next.
        watched = true;
        const state = await WATCH.run<string>(this.redis, [record, ref], [token]);
        if (state === 'gone') {
          yield { kind: 'gone' };
          return;
        }
        continue;
      }
      if (this.closed) {
        // Stopping: nothing waits any more; what was written is read, then the follower lets go.
        yield { kind: 'gone' };
        return;
      }
      const news = await this.streamWaiter().waitFor(
        ref,
        after === '-' ? '0-0' : after.slice(1),
        this.idleCheckMs,
        signal,
      );
      if (news || signal.aborted) continue;
      // Nothing for a while: the request may have died, its lock and frames expiring with it.
      if ((await this.redis.exists(ref)) === 0) {
        yield { kind: 'gone' };
        return;
      }
    }
  }

  /**
   * Closes the blocking connection, if one was made: followers still
   * waiting, and any that would wait from now on, hear `gone`; stored
   * answers are still read. Writes go on (the store's own client).
   */
  async close(): Promise<void> {
    this.closed = true;
    const waiter = this.waiter;
    this.waiter = undefined;
    await waiter?.close();
  }

  private streamWaiter(): StreamWaiter {
    this.waiter ??= createStreamWaiter(this.redis, this.blockingClient, this.logger);
    return this.waiter;
  }
}

function parseRef(ref: FramesRef): { record: string; token: string } {
  const close = ref.indexOf('}');
  if (ref.startsWith('{') && ref.startsWith(':r:', close + 1)) {
    // {<tag>}:r:<length>:<R>:<token>
    const lengthEnd = ref.indexOf(':', close + 4);
    const length = Number(ref.slice(close + 4, lengthEnd));
    const start = lengthEnd + 1;
    if (lengthEnd < 0 || !Number.isInteger(length) || ref[start + length] !== ':')
      throw new Error('not a frames reference of this store');
    return { record: ref.slice(start, start + length), token: ref.slice(start + length + 1) };
  }
  const end = ref.lastIndexOf('}:f:');
  if (!ref.startsWith('{') || end < 0) throw new Error('not a frames reference of this store');
  return { record: ref.slice(1, end), token: ref.slice(end + 4) };
}

function toEvent(fields: Buffer[]): FrameEvent | undefined {
  const [name, value] = fields;
  switch (name.toString()) {
    case 'd':
      return { kind: 'frame', data: value };
    case 'h':
      return { kind: 'head', head: JSON.parse(value.toString()) as StoredHead };
    case 'e':
      return { kind: 'end', outcome: value.toString() === 'completed' ? 'completed' : 'aborted' };
    default:
      return undefined;
  }
}
