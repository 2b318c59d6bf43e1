import {
  applyDecorators,
  ArgumentsHost,
  Catch,
  ExceptionFilter,
  HttpException,
  HttpStatus,
  Logger,
} from '@nestjs/common';
import { ApiResponse } from '@nestjs/swagger';
import type { IdempotencyErrorFormat } from '@app/idempotency';
import { PROBLEM_TYPE_PREFIX, toProblem } from '@app/problem';
import type { Response } from 'express';

/** OpenAI's error object, as its SDKs read it. */
export interface OpenAiErrorBody {
  readonly error: {
    readonly message: string;
    readonly type: string;
    readonly param: string | null;
    readonly code: string;
  };
}

/** An error of the gateway itself, already in OpenAI's shape. */
export class OpenAiErrorException extends HttpException {
  constructor(
    status: number,
    readonly code: string,
    message: string,
    readonly headers: Readonly<Record<string, string>> = {},
    readonly param: string | null = null,
  ) {
    super(message, status);
  }
}

/** OpenAI's `type` for a status: what its SDKs and users group errors by. */
function typeFor(status: number): string {
  if (status === HttpStatus.UNAUTHORIZED) return 'authentication_error';
  if (status === HttpStatus.TOO_MANY_REQUESTS) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** Codes that OpenAI's own clients know by another name. */
const CODE_RENAMES: Readonly<Record<string, string>> = { unauthorized: 'invalid_api_key' };

/**
 * The stable name of a problem type: its last segment, snake_cased (`idempotency-key-reused` →
 * `idempotency_key_reused`).
 */
function codeOfProblemType(type: string): string {
  const name = (
    type.startsWith(PROBLEM_TYPE_PREFIX) ? type.slice(PROBLEM_TYPE_PREFIX.length) : (type.split(/[:/]/).pop() ?? type)
  ).replace(/-/g, '_');
  return CODE_RENAMES[name] ?? name;
}

export interface RenderedOpenAiError {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: OpenAiErrorBody;
}

/**
 * Any error of the gateway route as OpenAI's envelope: the same status and
 * headers (Retry-After, plus the `retry-after-ms` OpenAI's SDKs prefer) that
 * the problem+json answer would have, `code` the stable name of the case.
 */
export function toOpenAiError(exception: unknown): RenderedOpenAiError {
  if (exception instanceof OpenAiErrorException) {
    const status = exception.getStatus();
    return {
      status,
      headers: gatewayErrorHeaders(exception.headers, status),
      body: {
        error: { message: exception.message, type: typeFor(status), param: exception.param, code: exception.code },
      },
    };
  }
  const problem = toProblem(exception);
  const detail = problem.body.detail;
  const errors = (problem.body as { errors?: unknown }).errors;
  const fields = Array.isArray(errors)
    ? errors
        .map(
          (e: { field?: unknown; messages?: unknown }) =>
            `${String(e.field)}: ${Array.isArray(e.messages) ? e.messages.join(', ') : ''}`,
        )
        .join('; ')
    : '';
  const message = [problem.body.title, detail, fields].filter((part) => part).join('. ');
  return {
    status: problem.status,
    headers: gatewayErrorHeaders(problem.headers, problem.status),
    body: {
      error: { message, type: typeFor(problem.status), param: null, code: codeOfProblemType(problem.body.type) },
    },
  };
}

/**
 * `x-should-retry` on the gateway's own errors, which OpenAI's SDKs obey
 * before their own rule by status: a key still running (409) is worth a
 * retry; a refused body, key or credential (400, 401, 422) never is.
 */
const SHOULD_RETRY: Readonly<Record<number, string>> = { 400: 'false', 401: 'false', 409: 'true', 422: 'false' };

function gatewayErrorHeaders(headers: Readonly<Record<string, string>>, status: number): Record<string, string> {
  const out: Record<string, string> = { ...headers };
  if (SHOULD_RETRY[status] !== undefined && !Object.keys(out).some((n) => n.toLowerCase() === 'x-should-retry'))
    out['x-should-retry'] = SHOULD_RETRY[status];
  const retryAfter = Object.entries(headers).find(([name]) => name.toLowerCase() === 'retry-after')?.[1];
  if (retryAfter !== undefined && /^\d+$/.test(retryAfter)) out['retry-after-ms'] = String(Number(retryAfter) * 1000);
  return out;
}

/** The last event of a stream the gateway could not finish: the SDKs raise it as an APIError. */
export const BROKEN_STREAM_EVENT = `data: ${JSON.stringify({
  error: {
    message:
      'The model provider’s stream ended before data: [DONE]. Nothing was stored; retry with the same Idempotency-Key.',
    type: 'server_error',
    param: null,
    code: 'stream_broken',
  },
})}\n\n`;

/**
 * The same for a Responses API stream: its `error` event, which OpenAI's SDKs
 * raise as an APIError (the Responses API sends no `data: [DONE]`).
 */
export const RESPONSES_BROKEN_STREAM_EVENT = `event: error\ndata: ${JSON.stringify({
  type: 'error',
  code: 'stream_broken',
  message:
    'The model provider’s stream did not complete (no response.completed or response.incomplete). Nothing was stored; retry with the same Idempotency-Key.',
  param: null,
})}\n\n`;

function renderOpenAiError(exception: unknown): ReturnType<IdempotencyErrorFormat['render']> {
  const { status, headers, body } = toOpenAiError(exception);
  return { status, headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(body) };
}

/** How the idempotency layer writes the gateway's answers: OpenAI's envelope, and the broken-stream event. */
export const openAiErrorFormat: IdempotencyErrorFormat = {
  render: renderOpenAiError,
  brokenStreamFrame: () => BROKEN_STREAM_EVENT,
};

/** The same for POST /v1/responses: its streams end in the Responses API's `error` event. */
export const openAiResponsesErrorFormat: IdempotencyErrorFormat = {
  render: renderOpenAiError,
  brokenStreamFrame: () => RESPONSES_BROKEN_STREAM_EVENT,
};

/** Renders every error of the gateway's routes in OpenAI's envelope instead of problem+json. */
@Catch()
export class OpenAiErrorFilter implements ExceptionFilter {
  private readonly logger = new Logger(OpenAiErrorFilter.name);

  catch(exception: unknown, host: ArgumentsHost): void {
    if (host.getType() !== 'http') throw exception;
    const res = host.switchToHttp().getResponse<Response>();
    const { status, headers, body } = toOpenAiError(exception);
    if (!(exception instanceof HttpException)) {
      this.logger.error(exception instanceof Error ? exception : String(exception));
    } else if (status >= 500) {
      this.logger.warn(`${status} ${body.error.code}: ${body.error.message}`);
    }
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.status(status).set(headers).type('application/json').send(JSON.stringify(body));
  }
}

type SchemaObject = NonNullable<Extract<Parameters<typeof ApiResponse>[0], { schema?: unknown }>['schema']>;

const OPENAI_ERROR_SCHEMA: SchemaObject = {
  type: 'object',
  required: ['error'],
  properties: {
    error: {
      type: 'object',
      required: ['message', 'type', 'code'],
      properties: {
        message: { type: 'string' },
        type: { type: 'string', example: 'invalid_request_error' },
        param: { type: 'string', nullable: true },
        code: { type: 'string', example: 'idempotency_key_reused' },
      },
    },
  },
};

/** OpenAPI: these answers are OpenAI error objects, not problem+json. */
export function ApiOpenAiErrors(descriptions: Readonly<Record<number, string>>): MethodDecorator {
  return applyDecorators(
    ...Object.entries(descriptions).map(([status, description]) =>
      ApiResponse({
        status: Number(status),
        description,
        content: { 'application/json': { schema: OPENAI_ERROR_SCHEMA } },
      }),
    ),
  );
}

/**
 * The OpenAPI answers of a route that makes completions (chat completions,
 * responses), beside its own 400 (`bodyRefusals`: what its body check refuses).
 */
export function ApiGatewayCallErrors(bodyRefusals: string): MethodDecorator {
  return ApiOpenAiErrors({
    400:
      `${bodyRefusals}, the Idempotency-Key or Idempotency-Scope is malformed, or request_exceeds_token_limit ` +
      '(the call’s worst case is over your whole token limit). Nothing was done.',
    401:
      'No or unknown API key; X-Tenant sent with a tenant key; or INTERNAL_API_KEY without one X-Tenant naming a ' +
      'tenant of API_KEYS.',
    404: 'model_not_found: no upstream of GATEWAY_UPSTREAMS lists the model; nothing was sent upstream.',
    409: 'A call with this key is still running and has not started answering within 30 s; retry after Retry-After (retry-after-ms).',
    422: 'This key was already used with a different body (another prompt, model, parameter, or stream flag).',
    429:
      'tenant_token_limit: your token limit (TENANT_TOKEN_LIMITS) has no room for this call now, retry after Retry-After; ' +
      'or the provider’s own answer, passed through (so is any non-2xx, with its body and Retry-After). Nothing was stored.',
    502: 'The provider is unreachable; nothing was stored.',
    503:
      'The call cannot be made safe to retry right now (the idempotency store or the token limiter is unreachable); ' +
      'nothing was sent upstream.',
    504: 'The provider did not answer within GATEWAY_TIMEOUT_S; nothing was stored.',
  });
}
