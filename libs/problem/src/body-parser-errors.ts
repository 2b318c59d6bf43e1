import { HttpStatus } from '@nestjs/common';
import type { NextFunction, Request, Response } from 'express';
import { rejectBody } from './body-rejection';
import { JsonLimitError, jsonLimitProblem } from './json-limits';
import type { ProblemDocument } from './problem';
import { ProblemTypes } from './problem-types';

interface BodyParserError {
  readonly type?: string;
  readonly status?: number;
  readonly limit?: number;
}

function problemFor(err: BodyParserError): ProblemDocument {
  if (err instanceof JsonLimitError) return jsonLimitProblem(err.exceeded);
  switch (err.type) {
    case 'entity.too.large':
      return {
        type: ProblemTypes.payloadTooLarge,
        title: 'The request body is too large',
        status: HttpStatus.PAYLOAD_TOO_LARGE,
        detail: `The body must not exceed ${err.limit ?? 'the limit'} bytes.`,
      };
    case 'entity.parse.failed':
      return {
        type: ProblemTypes.malformedJson,
        title: 'The request body is not valid JSON',
        status: HttpStatus.BAD_REQUEST,
      };
    case 'encoding.unsupported':
      return {
        type: ProblemTypes.unsupportedMediaType,
        title: 'The request body encoding is not supported',
        status: HttpStatus.UNSUPPORTED_MEDIA_TYPE,
        detail: 'Content-Encoding may be gzip, deflate or br.',
      };
    case 'charset.unsupported':
      return {
        type: ProblemTypes.unsupportedMediaType,
        title: 'The request body encoding is not supported',
        status: HttpStatus.UNSUPPORTED_MEDIA_TYPE,
        detail: 'JSON bodies must be UTF-8: send charset=utf-8, or no charset.',
      };
    default:
      // request.aborted, request.size.invalid, a broken compressed stream, ...:
      // whatever else the parser refuses is the body's fault, never a 500.
      return {
        type: ProblemTypes.http(HttpStatus.BAD_REQUEST),
        title: 'The request body could not be read',
        status: HttpStatus.BAD_REQUEST,
      };
  }
}

/**
 * Express error middleware, mounted right after the body parser: the
 * parser's failure is recorded for BodyRejectionGuard rather than answered
 * here (see rejectBody), and the request goes on to be logged and counted.
 */
export function bodyParserErrorHandler(err: unknown, req: Request, _res: Response, next: NextFunction): void {
  if (typeof err !== 'object' || err === null) return next(err);
  rejectBody(req, problemFor(err));
  next();
}
