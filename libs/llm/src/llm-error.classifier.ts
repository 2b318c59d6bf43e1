import { parseRetryAfter } from '@app/client';
import { APIConnectionError, APIError, APIUserAbortError } from 'openai';
import { CallTimeoutError, EmptyCompletionError, GatewayAuthError, LlmErrorClass } from './llm.errors';

const RETRYABLE_STATUS = new Set([408, 409, 429]);

/**
 * Explicit classification of what a model call threw. Retried: our own
 * wall-clock timeouts, connection failures (the SDK's APIConnectionError and
 * APIConnectionTimeoutError), 408, 409, 429 and every 5xx. Everything else,
 * unknown errors included, is not: retrying a 400 only spends money.
 * A provider's `x-should-retry` header overrides the status; its
 * `retry-after-ms` / `Retry-After` is read by the client's parseRetryAfter.
 * The gateway refusing the worker's internal key (GatewayAuthError) is
 * retried too, and so redelivered: it means the api and the worker disagree
 * about INTERNAL_API_KEY (a rollout, a rotation), which passes, and
 * MAX_DELIVERIES bounds one that does not.
 */
export function classifyLlmError(err: unknown): LlmErrorClass {
  if (err instanceof CallTimeoutError) return { kind: 'timeout', retryable: true };
  if (err instanceof GatewayAuthError) return { kind: 'gateway_auth', retryable: true, status: err.status };
  // Our own timer aborts the request: the client reports that as the SDK's user abort.
  if (err instanceof APIUserAbortError) return { kind: 'timeout', retryable: true };
  if (err instanceof APIConnectionError) return { kind: 'connection', retryable: true };
  if (err instanceof EmptyCompletionError) return { kind: 'empty_answer', retryable: false };
  if (err instanceof APIError && typeof err.status === 'number') {
    const status = err.status;
    const headers = err.headers as Headers | undefined;
    const retryAfterMs = headers ? parseRetryAfter(headers) : undefined;
    const kind =
      status === 429
        ? 'rate_limited'
        : status >= 500
          ? 'server'
          : status === 409
            ? 'conflict'
            : status === 408
              ? 'timeout'
              : 'client';
    let retryable = RETRYABLE_STATUS.has(status) || status >= 500;
    const shouldRetry = headers?.get('x-should-retry');
    if (shouldRetry === 'true') retryable = true;
    if (shouldRetry === 'false') retryable = false;
    return { kind, retryable, status, ...(retryAfterMs === undefined ? {} : { retryAfterMs }) };
  }
  if (isNodeConnectionError(err)) return { kind: 'connection', retryable: true };
  return { kind: 'unknown', retryable: false };
}

const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'UND_ERR_SOCKET',
]);

function isNodeConnectionError(err: unknown): boolean {
  const code =
    (err as { code?: unknown; cause?: { code?: unknown } } | null)?.code ??
    (err as { cause?: { code?: unknown } } | null)?.cause?.code;
  return typeof code === 'string' && CONNECTION_CODES.has(code);
}
