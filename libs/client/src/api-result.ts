/** An RFC 9457 problem, as the api sends every error (or one made up for a body that was not one). */
export interface Problem {
  readonly type: string;
  readonly title?: string;
  readonly status?: number;
  readonly detail?: string;
  readonly [member: string]: unknown;
}

/** Why the last attempt of a call that ended without an answer did not give one. */
export type AttemptFailure =
  | { readonly kind: 'network'; readonly message: string; readonly cause?: unknown }
  | { readonly kind: 'timeout'; readonly afterMs: number }
  | { readonly kind: 'status'; readonly status: number; readonly problem: Problem; readonly retryAfterMs?: number };

/** The server answered 2xx: the operation happened (now, or earlier under the same key). */
export interface Succeeded<T> {
  readonly outcome: 'succeeded';
  readonly status: number;
  readonly body: T;
  /** `Idempotent-Replayed: true`: the stored answer of an earlier request with this key. */
  readonly replayed: boolean;
  readonly location?: string;
  readonly attempts: number;
}

/**
 * The server refused the request (400, 401, 403, 404, 413, 415, 422, other
 * 4xx): nothing was done, and sending it again would be refused again. Fix the
 * request (a 422 on a POST means this key was already used with another body).
 */
export interface Rejected {
  readonly outcome: 'rejected';
  readonly status: number;
  readonly problem: Problem;
  readonly attempts: number;
}

/**
 * No definitive answer before the deadline (`deadline`), the caller's signal
 * (`aborted`) or the attempt limit (`attempts`). This is NOT a failure: the
 * operation may or may not have happened (a request can be processed and its
 * answer lost). Do not report it as failed and do not send it again under a new
 * key. Retry later with the SAME key (the same business facts rebuild it), which
 * either replays the answer or does the operation once; or look the result up.
 * `attempts: 0` means nothing was sent.
 */
export interface Unknown {
  readonly outcome: 'unknown';
  readonly reason: 'deadline' | 'aborted' | 'attempts';
  readonly lastError?: AttemptFailure;
  readonly attempts: number;
}

export type ApiResult<T> = Succeeded<T> | Rejected | Unknown;
