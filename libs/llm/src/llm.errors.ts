/** How a failed model call is treated: retried in this delivery, or not at all. */
export type LlmErrorKind =
  | 'timeout'
  | 'connection'
  | 'rate_limited'
  | 'server'
  | 'conflict'
  | 'client'
  | 'empty_answer'
  | 'unknown';

export interface LlmErrorClass {
  readonly kind: LlmErrorKind;
  readonly retryable: boolean;
  /** What the provider asked for (Retry-After / retry-after-ms), uncapped. */
  readonly retryAfterMs?: number;
  readonly status?: number;
}

/** The model answered 2xx without a summary. */
export class EmptyCompletionError extends Error {
  constructor() {
    super('the model returned no summary');
    this.name = 'EmptyCompletionError';
  }
}

/** Our own wall-clock limit for one attempt ran out and aborted the call. */
export class CallTimeoutError extends Error {
  constructor(readonly timeoutMs: number) {
    super(`model call exceeded its ${timeoutMs} ms limit`);
    this.name = 'CallTimeoutError';
  }
}
