/*
 * @llm-workflows/nestjs-idempotency: libs/idempotency's own surface, and the
 * problem+json filter that renders its errors (and any other) with their
 * content type and headers (the 409's and 503's Retry-After).
 */
export * from '../src/index';
export {
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_PREFIX,
  ProblemDetailsFilter,
  type ProblemDocument,
  ProblemException,
  type ProblemInit,
} from '@app/problem';
