import { Inject } from '@nestjs/common';

/** An answer as it is replayed: status, the allowlisted headers, the raw body. */
export interface StoredResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  /**
   * The whole body, as bytes: whatever they are (a NUL, invalid UTF-8 from a
   * provider), they are stored and replayed as they were sent. Empty for an
   * answer recorded as frames.
   */
  readonly body: Buffer;
  /**
   * Set for an answer recorded as a sequence of frames (a streamed answer,
   * e.g. server-sent events): where `frames.follow()` reads them from.
   */
  readonly frames?: FramesRef;
}

/** The status and headers of a streamed answer, known before its first frame. */
export interface StoredHead {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  /**
   * False for an answer relayed to its caller only (too large to store): its
   * frames are never logged, and a follower that reads this head answers 409
   * instead of attaching. The key is freed when it ends.
   */
  readonly storable?: false;
}

/** Names one request's frame log in a store. Opaque to callers. */
export type FramesRef = string & { readonly __framesRef: never };

export type ClaimResult =
  /**
   * This request holds the lock now and must run the handler. `tookOver`:
   * the key was held by a request whose lock expired (it died, or stalled),
   * so its effect may have happened; set by stores that can tell (a Redis
   * record vanishes with its lock, so the Redis store never sets it).
   */
  | { readonly outcome: 'claimed'; readonly tookOver?: boolean }
  /**
   * Another request holds the lock: it has run for `runningForMs` (by the
   * store's clock, so every api instance agrees), and the lock frees in
   * `expiresInMs` unless that request renews it. `frames` names where its
   * answer can be followed while it runs, on a store that keeps frames.
   */
  | {
      readonly outcome: 'in-progress';
      readonly fingerprint: string;
      readonly runningForMs: number;
      readonly expiresInMs: number;
      readonly frames?: FramesRef;
    }
  /** A finished answer is stored for this key. */
  | { readonly outcome: 'completed'; readonly fingerprint: string; readonly response: StoredResponse };

/**
 * What a follower of a running (or finished) request sees, in order: the
 * head once the answer starts streaming, its frames, then the end. `end`
 * without a head means the request finished with a whole answer, or was
 * freed, without streaming: claim again to find out which. `gone`: the
 * request died (its lock expired) or its frames expired.
 */
/** What `peek` finds: nothing a claim would respect, or what a claim by another request would be told. */
export type PeekResult = { readonly outcome: 'absent' } | Exclude<ClaimResult, { readonly outcome: 'claimed' }>;

export type FrameEvent =
  | { readonly kind: 'head'; readonly head: StoredHead }
  /** One frame, its bytes as they were appended. */
  | { readonly kind: 'frame'; readonly data: Buffer }
  | { readonly kind: 'end'; readonly outcome: 'completed' | 'aborted' }
  | { readonly kind: 'gone' };

/**
 * The frame log of a store: a running request's streamed answer, written as
 * it is produced, which any api instance can follow while it runs and replay
 * once it is complete. Writes are conditional on the running request's token
 * like every other change to a record.
 */
export interface IdempotencyFrameLog {
  /** Our running request starts streaming its answer with `head`. False if the lock is no longer ours. */
  begin(key: string, token: string, head: StoredHead): Promise<boolean>;
  /**
   * Appends frames in order, each stored as its bytes (a string as its
   * UTF-8). False if the lock is no longer ours.
   */
  append(key: string, token: string, frames: readonly (Uint8Array | string)[]): Promise<boolean>;
  /**
   * Our streamed answer is whole: the record becomes completed (its frames
   * kept `resultTtlMs`), and its followers see `end: completed`. False if the
   * lock is no longer ours.
   */
  complete(key: string, token: string, fingerprint: string, resultTtlMs: number): Promise<boolean>;
  /**
   * `append(frames)` and `complete()` in one atomic write: the end of a
   * stream then waits for one round trip, not an append's and then the
   * completion's. Its followers see those frames, then `end: completed`.
   * False if the lock is no longer ours: nothing is appended then. Optional:
   * without it, the last frames are appended, then the record completed.
   */
  completeWith?(
    key: string,
    token: string,
    fingerprint: string,
    resultTtlMs: number,
    frames: readonly (Uint8Array | string)[],
  ): Promise<boolean>;
  /**
   * Every event of the frames at `ref` from the first, then the live ones as
   * they are written, until the end (or `gone`). Ends early, without an
   * event, when `signal` aborts. Throws when the backend cannot be reached.
   */
  follow(ref: FramesRef, signal: AbortSignal): AsyncIterable<FrameEvent>;
}

/**
 * Where idempotency records live. Every operation that changes a running
 * record is conditional on the caller's token, so a request that lost its lock
 * can never overwrite or delete the record of the request that took over.
 * Implementations throw when the backend cannot be reached: callers fail
 * closed. The contract suite in `testing/` states the semantics.
 */
export interface IdempotencyStore {
  /** Atomically: take the lock for `key` with `token` if the key is free, else return its record. */
  claim(key: string, token: string, fingerprint: string, lockTtlMs: number): Promise<ClaimResult>;
  /** Replace our lock by the final answer, kept `resultTtlMs`. False if the lock is no longer ours. */
  complete(
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean>;
  /**
   * complete(), inside the caller's own open transaction `tx` (store
   * specific: an EntityManager for a PostgreSQL store), so the answer commits
   * with the effect's rows or not at all. Stores that share no database with
   * the handler leave it out.
   */
  completeWithin?(
    tx: unknown,
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean>;
  /**
   * Free the key so a retry runs again; followers of its frames see `end:
   * aborted`. False if the lock is no longer ours.
   */
  release(key: string, token: string): Promise<boolean>;
  /**
   * Give up the key without knowing what our request did: the lock ends now
   * and the record stays, so the next request with the key takes it over
   * knowingly (`tookOver`) and the route's recovery can look the outcome up.
   * Stores that cannot tell a takeover leave it out; release() serves then.
   */
  abandon?(key: string, token: string): Promise<boolean>;
  /**
   * The record of `key` as a claim by another request would see it, taking
   * nothing: `absent` when a claim would take the key (none, expired, or a
   * dead holder's lapsed lock). For readers of a record that is not theirs
   * (the gateway's GET /v1/responses/<id> and its resumed streams). Stores
   * that cannot leave it out.
   */
  peek?(key: string): Promise<PeekResult>;
  /** Extend our lock (and our frames) to `lockTtlMs` from now. False if the lock is no longer ours. */
  renew(key: string, token: string, lockTtlMs: number): Promise<boolean>;
  /**
   * Streamed answers and following running requests, where the store keeps
   * them. Without it, a streamed answer is relayed but not stored, and a
   * duplicate of a running request gets 409.
   */
  readonly frames?: IdempotencyFrameLog;
}

export const IdempotencyStore = Symbol('IdempotencyStore');
export const InjectIdempotencyStore = (): ParameterDecorator => Inject(IdempotencyStore);
