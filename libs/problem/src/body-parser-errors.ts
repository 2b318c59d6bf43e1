import { HttpStatus } from '@nestjs/common';
import type { NextFunction, Request, Response } from 'express';
import { PROBLEM_CONTENT_TYPE, ProblemDocument } from './problem';
import { ProblemTypes } from './problem-types';

interface BodyParserError {
  readonly type?: string;
  readonly status?: number;
  readonly limit?: number;
}

function problemFor(err: BodyParserError): ProblemDocument | undefined {
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
    case 'charset.unsupported':
      return {
        type: ProblemTypes.unsupportedMediaType,
        title: 'The request body encoding is not supported',
        status: HttpStatus.UNSUPPORTED_MEDIA_TYPE,
      };
    case 'request.aborted':
    case 'request.size.invalid':
    case 'stream.encoding.set':
      return {
        type: ProblemTypes.http(HttpStatus.BAD_REQUEST),
        title: 'The request body could not be read',
        status: HttpStatus.BAD_REQUEST,
      };
    default:
      return undefined;
  }
}

/**
 * Express error middleware for the body parser, which fails before Nest's
 * exception filters can see the request. Mounted right after the parser.
 */
export function bodyParserErrorHandler(
  err: unknown,
  _req: Request,
  res: Response,
  next: NextFunction,
): void {
  const problem = typeof err === 'object' && err !== null ? problemFor(err as BodyParserError) : undefined;
  if (!problem) return next(err);
  res.status(problem.status).type(PROBLEM_CONTENT_TYPE).send(JSON.stringify(problem));
}
