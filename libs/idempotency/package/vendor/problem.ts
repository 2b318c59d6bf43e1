/*
 * What the package takes from libs/problem, file by file: @app/problem's
 * index would bring the validation pipe (class-validator), the JSON body
 * parser (express) and the rest, none of which @Idempotent() needs.
 * scripts/pack.mjs builds @app/problem as this file; a new name imported
 * from @app/problem in libs/idempotency fails the pack until it is added here.
 */
export {
  PROBLEM_CONTENT_TYPE,
  ProblemException,
  type ProblemDocument,
  type ProblemInit,
} from '../../../problem/src/problem';
export { PROBLEM_TYPE_PREFIX, ProblemTypes } from '../../../problem/src/problem-types';
export { toProblem, type RenderedProblem } from '../../../problem/src/to-problem';
export { ApiProblemResponse } from '../../../problem/src/api-problem-response';
export { ProblemDetailsFilter } from '../../../problem/src/problem-details.filter';
export { headerValues } from '../../../problem/src/request-headers';

/**
 * The monorepo's apps parse JSON with useJsonBody, which keeps the bytes as
 * sent; an app of its own parses with Nest's parser, so the fingerprint is
 * taken from the parsed body (canonical JSON).
 */
export function rawBodyOf(_req: object): Buffer | undefined {
  return undefined;
}
