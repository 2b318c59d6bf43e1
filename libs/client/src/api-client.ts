import { setTimeout as delay } from 'node:timers/promises';
import type { ApiResult, AttemptFailure, Problem, Unknown } from './api-result';
import { IDEMPOTENCY_KEY_MAX_LENGTH, IDEMPOTENCY_KEY_MIN_LENGTH } from './idempotency-key';
import { type AttemptEnd, type BackoffOptions, decideAfterAttempt, parseRetryAfter } from './retry-decision';

export interface ApiClientOptions {
  /** `http://host:port`, optionally with a path prefix. */
  readonly baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  readonly apiKey: string;
  /** Overall time for one call, every attempt and wait included. Default 30 s. */
  readonly deadlineMs?: number;
  /** One attempt's limit (capped by the time left). Default 10 s. */
  readonly attemptTimeoutMs?: number;
  /** Default 8. */
  readonly maxAttempts?: number;
  /** Full-jitter backoff; default base 100 ms, cap 5 s. */
  readonly backoff?: Partial<BackoffOptions>;
  readonly fetch?: typeof fetch;
  /** For tests: waits `ms`, rejecting when `signal` aborts. */
  readonly sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** For tests: [0, 1). */
  readonly random?: () => number;
  /** For tests: a monotonic clock in ms. */
  readonly now?: () => number;
}

export interface CallOptions {
  /** This call's overall deadline instead of the client's. */
  readonly deadlineMs?: number;
  /** Stops the call (the result is `unknown`, reason `aborted`). */
  readonly signal?: AbortSignal;
}

export interface PostOptions extends CallOptions {
  /** The Idempotency-Key, the same for every attempt. Build it with `idempotencyKey()`. */
  readonly key: string;
}

/** An attempt shorter than this is not worth waiting for (the decision keeps this much for the last one). */
const MIN_ATTEMPT_MS = 100;
/** Timers fire late: a wait cut to leave MIN_ATTEMPT_MS may leave a little less. */
const MIN_START_MS = MIN_ATTEMPT_MS / 2;

/**
 * A client for the api that retries safely: every attempt of a POST carries the
 * same Idempotency-Key, so a retry after a lost answer replays it instead of
 * doing the work twice. Retries connection errors, attempt timeouts, 408, 409,
 * 425, 429 and 5xx (full jitter, or the server's Retry-After) under one overall
 * deadline; never retries other 4xx. Results are `succeeded`, `rejected` or
 * `unknown` (see `Unknown`): a call that ran out of time is never reported as
 * failed. Needs only Node's global fetch.
 */
export class ApiClient {
  private readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly deadlineMs: number;
  private readonly attemptTimeoutMs: number;
  private readonly maxAttempts: number;
  private readonly backoff: BackoffOptions;
  private readonly fetchImpl: typeof fetch;
  private readonly sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  private readonly random: () => number;
  private readonly now: () => number;

  constructor(options: ApiClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.deadlineMs = positive(options.deadlineMs ?? 30_000, 'deadlineMs');
    this.attemptTimeoutMs = positive(options.attemptTimeoutMs ?? 10_000, 'attemptTimeoutMs');
    this.maxAttempts = positive(options.maxAttempts ?? 8, 'maxAttempts');
    this.backoff = { baseMs: options.backoff?.baseMs ?? 100, capMs: options.backoff?.capMs ?? 5_000 };
    this.fetchImpl = options.fetch ?? globalThis.fetch;
    this.sleep = options.sleep ?? ((ms, signal) => delay(ms, undefined, { signal }));
    this.random = options.random ?? Math.random;
    this.now = options.now ?? (() => performance.now());
  }

  /** POSTs `body` as JSON under `options.key`, retrying as the class says. */
  post<T>(path: string, body: unknown, options: PostOptions): Promise<ApiResult<T>> {
    assertKey(options.key);
    return this.call<T>('POST', path, JSON.stringify(body), options.key, options);
  }

  /** GETs `path` (safe to repeat: retried like a POST, without a key). */
  get<T>(path: string, options: CallOptions = {}): Promise<ApiResult<T>> {
    return this.call<T>('GET', path, undefined, undefined, options);
  }

  private async call<T>(
    method: 'GET' | 'POST',
    path: string,
    body: string | undefined,
    key: string | undefined,
    options: CallOptions,
  ): Promise<ApiResult<T>> {
    const url = this.baseUrl + (path.startsWith('/') ? path : `/${path}`);
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.apiKey}`,
      accept: 'application/json, application/problem+json',
    };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (key !== undefined) headers['idempotency-key'] = key;
    const { signal } = options;
    const deadlineAt = this.now() + (options.deadlineMs ?? this.deadlineMs);
    let attempts = 0;
    let lastError: AttemptFailure | undefined;
    const unknown = (reason: Unknown['reason']): Unknown => ({ outcome: 'unknown', reason, lastError, attempts });

    for (;;) {
      if (signal?.aborted) return unknown('aborted');
      const remaining = deadlineAt - this.now();
      if (remaining < MIN_START_MS) return unknown('deadline');
      attempts++;
      const attemptMs = Math.floor(Math.min(this.attemptTimeoutMs, remaining));
      const timeout = AbortSignal.timeout(attemptMs);
      const attemptSignal = signal ? AbortSignal.any([signal, timeout]) : timeout;

      let end: AttemptEnd;
      let answer: { status: number; headers: Headers; text: string; json: unknown } | undefined;
      try {
        const res = await this.fetchImpl(url, { method, headers, body, signal: attemptSignal, redirect: 'manual' });
        // The body is part of the answer: a connection lost while reading it is
        // a lost answer like any other, and the retry replays it.
        const text = await res.text();
        let json: unknown;
        if (isJson(res.headers) && text !== '') {
          try {
            json = JSON.parse(text);
          } catch (err) {
            // An unreadable 2xx is a lost answer (retried, and replayed);
            // an unreadable error still has its status.
            if (res.ok) throw err;
          }
        }
        answer = { status: res.status, headers: res.headers, text, json };
        end = { kind: 'response', status: res.status, retryAfterMs: parseRetryAfter(res.headers) };
      } catch (err) {
        if (signal?.aborted) return unknown('aborted');
        if (timeout.aborted) {
          end = { kind: 'timeout' };
          lastError = { kind: 'timeout', afterMs: attemptMs };
        } else {
          end = { kind: 'network' };
          lastError = { kind: 'network', message: describe(err), cause: err };
        }
      }

      const decision = decideAfterAttempt({
        end,
        attempts,
        maxAttempts: this.maxAttempts,
        remainingMs: deadlineAt - this.now(),
        minAttemptMs: MIN_ATTEMPT_MS,
        backoff: this.backoff,
        random: this.random,
      });
      switch (decision.action) {
        case 'succeed': {
          const a = answer!;
          return {
            outcome: 'succeeded',
            status: a.status,
            body: (a.json ?? (a.text === '' ? undefined : a.text)) as T,
            replayed: a.headers.get('idempotent-replayed') === 'true',
            location: a.headers.get('location') ?? undefined,
            attempts,
          };
        }
        case 'reject': {
          const a = answer!;
          return { outcome: 'rejected', status: a.status, problem: toProblem(a.status, a.json, a.text), attempts };
        }
        case 'give-up':
          if (answer) lastError = statusFailure(answer, end);
          return unknown(decision.reason);
        case 'retry':
          if (answer) lastError = statusFailure(answer, end);
          try {
            if (decision.delayMs > 0) await this.sleep(decision.delayMs, signal);
          } catch {
            return unknown('aborted');
          }
          if (signal?.aborted) return unknown('aborted');
      }
    }
  }
}

function statusFailure(answer: { status: number; json: unknown; text: string }, end: AttemptEnd): AttemptFailure {
  return {
    kind: 'status',
    status: answer.status,
    problem: toProblem(answer.status, answer.json, answer.text),
    ...(end.kind === 'response' && end.retryAfterMs !== undefined ? { retryAfterMs: end.retryAfterMs } : {}),
  };
}

function toProblem(status: number, json: unknown, text: string): Problem {
  if (json !== null && typeof json === 'object' && typeof (json as { type?: unknown }).type === 'string') {
    return json as Problem;
  }
  return { type: 'about:blank', status, ...(text !== '' ? { detail: text.slice(0, 1000) } : {}) };
}

function isJson(headers: Headers): boolean {
  return /^application\/([a-z0-9.+-]+\+)?json\b/i.test(headers.get('content-type') ?? '');
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : '';
  return `${err.message}${cause}`;
}

function positive(value: number, name: string): number {
  if (!Number.isFinite(value) || value <= 0) throw new TypeError(`ApiClient: ${name} must be a positive number`);
  return value;
}

/** The header's rules, checked here so a bad key is a programming error, not a 400. */
function assertKey(key: string): void {
  if (typeof key !== 'string' || key.length < IDEMPOTENCY_KEY_MIN_LENGTH || key.length > IDEMPOTENCY_KEY_MAX_LENGTH) {
    throw new TypeError(
      `ApiClient: an Idempotency-Key has ${IDEMPOTENCY_KEY_MIN_LENGTH} to ${IDEMPOTENCY_KEY_MAX_LENGTH} characters`,
    );
  }
  if (!/^[\x21-\x7e]+$/.test(key) || key.includes(',') || key.startsWith('"')) {
    throw new TypeError('ApiClient: an Idempotency-Key is printable ASCII without spaces, commas or a leading quote');
  }
}
