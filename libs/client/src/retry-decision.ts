/**
 * What the client does after one attempt: one pure function from the facts of
 * that attempt to a decision, so the whole policy is a table in its spec and
 * ApiClient only does the I/O.
 */

/** How an attempt ended, as far as deciding goes. */
export type AttemptEnd =
  | { readonly kind: 'response'; readonly status: number; readonly retryAfterMs?: number }
  /** No answer: refused, reset, dropped mid-answer (the request may have been processed). */
  | { readonly kind: 'network' }
  /** No answer within the attempt's timeout (the request may have been processed). */
  | { readonly kind: 'timeout' };

export interface BackoffOptions {
  /** The first retry waits up to this long. */
  readonly baseMs: number;
  /** No jittered wait is longer than this. */
  readonly capMs: number;
}

export interface RetryFacts {
  readonly end: AttemptEnd;
  /** Attempts made so far, this one included (1 after the first). */
  readonly attempts: number;
  readonly maxAttempts: number;
  /** Until the overall deadline, now. */
  readonly remainingMs: number;
  /** An attempt needs at least this long to be worth starting. */
  readonly minAttemptMs: number;
  readonly backoff: BackoffOptions;
  /** [0, 1), Math.random's contract. */
  readonly random: () => number;
}

export type RetryDecision =
  | { readonly action: 'succeed' }
  | { readonly action: 'reject' }
  | { readonly action: 'retry'; readonly delayMs: number }
  | { readonly action: 'give-up'; readonly reason: 'deadline' | 'attempts' };

export type StatusClass = 'success' | 'retryable' | 'rejected';

/**
 * 2xx is an answer. 408, 409 (the same key still running), 425, 429 and every
 * 5xx are "not now": the same request, same key, may get the answer later.
 * Every other status (400, 401, 403, 404, 413, 415, 422, 3xx, ...) is the
 * server's definitive refusal of this request: sending it again changes nothing.
 */
export function classifyStatus(status: number): StatusClass {
  if (status >= 200 && status < 300) return 'success';
  if (status === 408 || status === 409 || status === 425 || status === 429 || (status >= 500 && status < 600)) {
    return 'retryable';
  }
  return 'rejected';
}

/**
 * Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): a
 * uniform wait in [0, min(cap, base·2^retry)), `retry` counting from 0.
 */
export function fullJitterDelay(retry: number, backoff: BackoffOptions, random: () => number): number {
  const ceiling = Math.min(backoff.capMs, backoff.baseMs * 2 ** Math.max(0, retry));
  const r = random();
  const unit = r >= 0 && r < 1 ? r : 0;
  return Math.floor(unit * ceiling);
}

export function decideAfterAttempt(facts: RetryFacts): RetryDecision {
  const { end } = facts;
  if (end.kind === 'response') {
    const cls = classifyStatus(end.status);
    if (cls === 'success') return { action: 'succeed' };
    if (cls === 'rejected') return { action: 'reject' };
  }
  // Time that may be spent waiting and still leave one useful attempt.
  const budget = facts.remainingMs - facts.minAttemptMs;
  if (budget < 0) return { action: 'give-up', reason: 'deadline' };
  if (facts.attempts >= facts.maxAttempts) return { action: 'give-up', reason: 'attempts' };
  const wanted =
    end.kind === 'response' && end.retryAfterMs !== undefined
      ? end.retryAfterMs
      : fullJitterDelay(facts.attempts - 1, facts.backoff, facts.random);
  // The server's hint is followed, but never past the deadline: one last
  // attempt just before it may still find the answer.
  return { action: 'retry', delayMs: Math.max(0, Math.floor(Math.min(wanted, budget))) };
}

/**
 * `retry-after-ms` (milliseconds, as some APIs send) or `Retry-After`
 * (delta-seconds or an HTTP-date, RFC 9110 §10.2.3); undefined when absent or
 * unreadable.
 */
export function parseRetryAfter(headers: Headers, now: number = Date.now()): number | undefined {
  const ms = headers.get('retry-after-ms');
  if (ms !== null && /^\s*\d+(\.\d+)?\s*$/.test(ms)) return Math.ceil(Number(ms));
  const value = headers.get('retry-after');
  if (value === null) return undefined;
  if (/^\s*\d+\s*$/.test(value)) return Number(value) * 1000;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}
