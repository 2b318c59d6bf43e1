import { HttpException, HttpStatus } from '@nestjs/common';
import { STATUS_CODES } from 'node:http';
import { ProblemDocument, ProblemException } from './problem';
import { ProblemTypes } from './problem-types';

const TYPE_BY_STATUS: Partial<Record<number, string>> = {
  [HttpStatus.UNAUTHORIZED]: ProblemTypes.unauthorized,
  [HttpStatus.FORBIDDEN]: ProblemTypes.forbidden,
  [HttpStatus.NOT_FOUND]: ProblemTypes.notFound,
  [HttpStatus.METHOD_NOT_ALLOWED]: ProblemTypes.methodNotAllowed,
  [HttpStatus.PAYLOAD_TOO_LARGE]: ProblemTypes.payloadTooLarge,
  [HttpStatus.UNSUPPORTED_MEDIA_TYPE]: ProblemTypes.unsupportedMediaType,
  [HttpStatus.SERVICE_UNAVAILABLE]: ProblemTypes.serviceUnavailable,
};

export interface RenderedProblem {
  readonly status: number;
  readonly body: ProblemDocument;
  readonly headers: Readonly<Record<string, string>>;
}

/**
 * The problem+json answer for any thrown value: the one place that decides it,
 * used by the exception filter and by whoever must know the answer before it
 * is sent (the idempotency interceptor stores business 4xx answers).
 * Unknown errors become a 500 that says nothing about their internals.
 */
export function toProblem(exception: unknown): RenderedProblem {
  if (exception instanceof ProblemException) {
    return { status: exception.getStatus(), body: exception.problem, headers: exception.headers };
  }
  if (exception instanceof HttpException) {
    const status = exception.getStatus();
    const title = STATUS_CODES[status] ?? 'Error';
    const detail = detailOf(exception.getResponse(), title);
    return {
      status,
      body: {
        type: TYPE_BY_STATUS[status] ?? ProblemTypes.http(status),
        title,
        status,
        ...(detail === undefined ? {} : { detail }),
      },
      headers: {},
    };
  }
  return {
    status: HttpStatus.INTERNAL_SERVER_ERROR,
    body: { type: ProblemTypes.internal, title: 'Internal Server Error', status: 500 },
    headers: {},
  };
}

function detailOf(response: string | object, title: string): string | undefined {
  if (typeof response === 'string') return response === title ? undefined : response;
  const message = (response as { message?: unknown }).message;
  if (typeof message === 'string') return message === title ? undefined : message;
  if (Array.isArray(message)) return message.join('; ');
  return undefined;
}
