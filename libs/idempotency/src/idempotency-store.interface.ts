import { Inject } from '@nestjs/common';

/** An answer as it is replayed: status, the allowlisted headers, the raw body. */
export interface StoredResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
}

export type ClaimResult =
  /** This request holds the lock now and must run the handler. */
  | { readonly outcome: 'claimed' }
  /**
   * Another request holds the lock: it has run for `runningForMs` (by the
   * store's clock, so every api instance agrees), and the lock frees in
   * `expiresInMs` unless that request renews it.
   */
  | { readonly outcome: 'in-progress'; readonly fingerprint: string; readonly runningForMs: number; readonly expiresInMs: number }
  /** A finished answer is stored for this key. */
  | { readonly outcome: 'completed'; readonly fingerprint: string; readonly response: StoredResponse };

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
  complete(key: string, token: string, fingerprint: string, response: StoredResponse, resultTtlMs: number): Promise<boolean>;
  /** Free the key so a retry runs again. False if the lock is no longer ours. */
  release(key: string, token: string): Promise<boolean>;
  /** Extend our lock to `lockTtlMs` from now. False if the lock is no longer ours. */
  renew(key: string, token: string, lockTtlMs: number): Promise<boolean>;
}

export const IdempotencyStore = Symbol('IdempotencyStore');
export const InjectIdempotencyStore = (): ParameterDecorator => Inject(IdempotencyStore);
