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
 * How long the other side asks to be left alone, in ms: `retry-after-ms`
 * (milliseconds, fractions allowed: OpenAI's header, no RFC; rounded up, so
 * never sooner than asked) wins over `Retry-After` (RFC 9110 §10.2.3:
 * delay-seconds, or an HTTP-date, §5.6.7, in any of its three formats; a
 * date in the past is 0). Undefined when absent or unreadable: a value that
 * is neither (`0.5`, `-1`, `2026-12-01`, `soon`) is ignored, not guessed at.
 * Both the client and the model calls (@app/llm) read it with this.
 */
export function parseRetryAfter(headers: Headers, now: number = Date.now()): number | undefined {
  const ms = headers.get('retry-after-ms')?.trim();
  if (ms !== undefined && /^\d+(\.\d+)?$/.test(ms)) return Math.ceil(Number(ms));
  const value = headers.get('retry-after')?.trim();
  if (value === undefined) return undefined;
  if (/^\d+$/.test(value)) return Number(value) * 1000;
  const date = parseHttpDate(value, now);
  return date === undefined ? undefined : Math.max(0, date - now);
}

/** The three HTTP-date formats (RFC 9110 §5.6.7) a recipient must accept. */
const HTTP_DATES: readonly RegExp[] = [
  // IMF-fixdate, the one a sender must use: Sun, 06 Nov 1994 08:49:37 GMT
  /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?<day>\d{2}) (?<month>[A-Z][a-z]{2}) (?<year>\d{4}) (?<time>\d{2}:\d{2}:\d{2}) GMT$/,
  // rfc850-date, obsolete: Sunday, 06-Nov-94 08:49:37 GMT
  /^(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, (?<day>\d{2})-(?<month>[A-Z][a-z]{2})-(?<yy>\d{2}) (?<time>\d{2}:\d{2}:\d{2}) GMT$/,
  // asctime-date, obsolete, in UTC though it does not say so: Sun Nov  6 08:49:37 1994
  /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?<month>[A-Z][a-z]{2}) (?<day>\d{2}| \d) (?<time>\d{2}:\d{2}:\d{2}) (?<year>\d{4})$/,
];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** An HTTP-date as epoch ms; undefined for anything else. */
function parseHttpDate(value: string, now: number): number | undefined {
  const parts = HTTP_DATES.map((format) => format.exec(value)?.groups).find((groups) => groups !== undefined);
  if (parts === undefined) return undefined;
  const month = MONTHS.indexOf(parts.month);
  const day = Number(parts.day);
  const [hour, minute, second] = parts.time.split(':').map(Number);
  if (month < 0 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) return undefined;
  return Date.UTC(
    parts.year === undefined ? fullYear(Number(parts.yy), now) : Number(parts.year),
    month,
    day,
    hour,
    minute,
    second,
  );
}

/** A two-digit year is the latest year ending in those digits that is at most 50 years ahead (RFC 9110 §5.6.7). */
function fullYear(yy: number, now: number): number {
  const thisYear = new Date(now).getUTCFullYear();
  const year = thisYear - (thisYear % 100) + yy;
  return year > thisYear + 50 ? year - 100 : year <= thisYear - 50 ? year + 100 : year;
}
