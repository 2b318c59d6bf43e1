/**
 * The one answer to "retry or not": what happened, and whether trying again
 * can succeed. It is made where an error is classified (classifyLlmError for
 * a model call; the worker classifies its database errors and its messages
 * the same way) and read by whoever decides: RetryPolicy within a delivery,
 * the consumer between deliveries.
 */
export interface ErrorClass<Kind extends string = string> {
  /** What happened: short and stable, a metric label and a dead letter's reason. */
  readonly kind: Kind;
  /** Whether another try can succeed. */
  readonly retryable: boolean;
  /** What the other side asked for (Retry-After / retry-after-ms), uncapped. */
  readonly retryAfterMs?: number;
  readonly status?: number;
}

/** What a failed model call was. */
export type LlmErrorKind =
  | 'timeout'
  | 'connection'
  | 'rate_limited'
  | 'server'
  | 'conflict'
  | 'client'
  | 'gateway_auth'
  | 'empty_answer'
  | 'unknown';

export type LlmErrorClass = ErrorClass<LlmErrorKind>;

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

/**
 * The api's gateway refused the worker's credentials (401 or 403, answered by
 * the gateway itself rather than relayed from the provider). Thrown by the
 * gateway-mode client only, wrapping the SDK's error as `cause`. It is about
 * the deployment, not the request: during a rollout the worker can hold
 * INTERNAL_API_KEY before the api does, and while the key is rotated the two
 * disagree for a moment; the same call succeeds once they agree.
 */
export class GatewayAuthError extends Error {
  constructor(
    readonly status: number,
    message: string,
    options: { cause: unknown },
  ) {
    super(`the gateway refused the internal key (${status}): ${message}`, options);
    this.name = 'GatewayAuthError';
  }
}
