import { HttpException } from '@nestjs/common';
import { ProblemTypes } from './problem-types';

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** The RFC 9457 document, plus extension members. */
export interface ProblemDocument {
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail?: string;
  readonly [extension: string]: unknown;
}

export interface ProblemInit {
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail?: string;
  /** Extension members, e.g. `errors` for a validation failure. */
  readonly extensions?: Readonly<Record<string, unknown>>;
  /** Response headers that belong to the answer, e.g. Retry-After. */
  readonly headers?: Readonly<Record<string, string>>;
}

/**
 * An error that crosses the wire as problem+json with a stable `type`. Throw it
 * (or a subclass) from anywhere in the request pipeline.
 */
export class ProblemException extends HttpException {
  readonly problem: ProblemDocument;
  readonly headers: Readonly<Record<string, string>>;

  constructor(init: ProblemInit) {
    const problem: ProblemDocument = {
      type: init.type,
      title: init.title,
      status: init.status,
      ...(init.detail === undefined ? {} : { detail: init.detail }),
      ...init.extensions,
    };
    super(problem, init.status);
    this.problem = problem;
    this.headers = init.headers ?? {};
  }
}

/**
 * The 503 every route answers when a dependency it needs does not answer:
 * problem+json `…service-unavailable`, with `Retry-After` (seconds, at least 1).
 * Say in `detail` whether anything was done.
 */
export function serviceUnavailable(title: string, detail?: string, retryAfterSeconds = 1): ProblemException {
  return new ProblemException({
    type: ProblemTypes.serviceUnavailable,
    title,
    status: 503,
    ...(detail === undefined ? {} : { detail }),
    headers: { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds))) },
  });
}
