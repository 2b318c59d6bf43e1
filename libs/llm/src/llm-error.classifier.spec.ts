import {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  APIUserAbortError,
  BadRequestError,
  InternalServerError,
  RateLimitError,
} from 'openai';
import { classifyLlmError } from './llm-error.classifier';
import { CallTimeoutError, EmptyCompletionError, GatewayAuthError } from './llm.errors';

const apiError = (status: number, headers: Record<string, string> = {}) =>
  APIError.generate(status, { error: { message: 'x' } }, 'x', new Headers(headers));

describe('classifyLlmError', () => {
  it.each([408, 409, 429, 500, 502, 503, 504, 529])('retries HTTP %i', (status) => {
    expect(classifyLlmError(apiError(status))).toMatchObject({ retryable: true, status });
  });

  it.each([400, 401, 403, 404, 413, 422])('does not retry HTTP %i', (status) => {
    expect(classifyLlmError(apiError(status))).toMatchObject({ retryable: false, status, kind: 'client' });
  });

  it('classifies by status: a 408 arrives as a plain APIError', () => {
    const err = apiError(408);
    expect(err.constructor).toBe(APIError);
    expect(classifyLlmError(err)).toMatchObject({ kind: 'timeout', retryable: true });
  });

  it('maps the SDK error classes', () => {
    expect(classifyLlmError(apiError(429))).toBeInstanceOf(Object);
    expect(apiError(429)).toBeInstanceOf(RateLimitError);
    expect(apiError(400)).toBeInstanceOf(BadRequestError);
    expect(apiError(503)).toBeInstanceOf(InternalServerError);
    expect(classifyLlmError(new APIConnectionError({ message: 'refused' }))).toEqual({
      kind: 'connection',
      retryable: true,
    });
    expect(classifyLlmError(new APIConnectionTimeoutError())).toEqual({ kind: 'connection', retryable: true });
  });

  it('treats the abort our own wall-clock timer causes as a timeout', () => {
    expect(classifyLlmError(new APIUserAbortError())).toEqual({ kind: 'timeout', retryable: true });
    expect(classifyLlmError(new CallTimeoutError(200))).toEqual({ kind: 'timeout', retryable: true });
  });

  it('lets x-should-retry override the status', () => {
    expect(classifyLlmError(apiError(400, { 'x-should-retry': 'true' }))).toMatchObject({ retryable: true });
    expect(classifyLlmError(apiError(503, { 'x-should-retry': 'false' }))).toMatchObject({ retryable: false });
  });

  it('does not retry unknown errors or an empty answer', () => {
    expect(classifyLlmError(new Error('what'))).toEqual({ kind: 'unknown', retryable: false });
    expect(classifyLlmError('a string')).toEqual({ kind: 'unknown', retryable: false });
    expect(classifyLlmError(new EmptyCompletionError())).toEqual({ kind: 'empty_answer', retryable: false });
  });

  it('retries a socket error from below the SDK', () => {
    expect(classifyLlmError(Object.assign(new Error('reset'), { code: 'ECONNRESET' }))).toMatchObject({
      retryable: true,
    });
  });

  it('carries the provider’s Retry-After', () => {
    expect(classifyLlmError(apiError(429, { 'retry-after': '3' }))).toMatchObject({ retryAfterMs: 3000 });
    expect(classifyLlmError(apiError(429, { 'retry-after-ms': '1500', 'retry-after': '9' }))).toMatchObject({
      retryAfterMs: 1500,
    });
  });

  it('retries the gateway’s 409 (the same key still running elsewhere) after its Retry-After', () => {
    // As the api's gateway answers it: OpenAI's envelope, Retry-After in seconds plus retry-after-ms.
    const inProgress = APIError.generate(
      409,
      { error: { message: 'still running', type: 'invalid_request_error', code: 'idempotency_request_in_progress' } },
      'still running',
      new Headers({ 'retry-after': '2', 'retry-after-ms': '2000', 'content-type': 'application/json' }),
    );
    expect(classifyLlmError(inProgress)).toEqual({
      kind: 'conflict',
      retryable: true,
      status: 409,
      retryAfterMs: 2000,
    });
    expect(classifyLlmError(apiError(409, { 'retry-after': '5' }))).toEqual({
      kind: 'conflict',
      retryable: true,
      status: 409,
      retryAfterMs: 5000,
    });
    // The gateway's own errors may say x-should-retry: true on a 409; it agrees with the status.
    expect(classifyLlmError(apiError(409, { 'x-should-retry': 'true', 'retry-after': '1' }))).toMatchObject({
      retryable: true,
      retryAfterMs: 1000,
    });
  });

  it('does not retry a provider’s 401 or 403, nor a reused key (422)', () => {
    expect(classifyLlmError(apiError(401))).toMatchObject({ kind: 'client', retryable: false });
    expect(classifyLlmError(apiError(403))).toMatchObject({ kind: 'client', retryable: false });
    expect(classifyLlmError(apiError(422))).toMatchObject({ kind: 'client', retryable: false });
  });

  it('retries the gateway refusing the internal key (a rollout or a rotation), so the job is redelivered', () => {
    for (const status of [401, 403]) {
      const refused = new GatewayAuthError(status, 'x', { cause: apiError(status, { 'www-authenticate': 'Bearer' }) });
      expect(classifyLlmError(refused)).toEqual({ kind: 'gateway_auth', retryable: true, status });
    }
  });
});
