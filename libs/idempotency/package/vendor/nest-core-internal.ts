/*
 * @nestjs/core/internal as the package builds it (scripts/pack.mjs): Nest 11
 * has no such entry point, and both majors have the two things the
 * interceptor and the route validator take from it at these paths.
 */
export { ContextUtils } from '@nestjs/core/helpers/context-utils';

/**
 * Nest's router marks a request its pipes refused with this registered
 * symbol (router/rejected-by-pipes in @nestjs/core), so that packages built
 * against another Nest can read the marker without importing Nest's module.
 */
const REJECTED_BY_PIPES = Symbol.for('nestjs:rejected-by-pipes');

export function isRejectedByPipes(request: unknown): boolean {
  return (
    typeof request === 'object' && request !== null && (request as Record<symbol, unknown>)[REJECTED_BY_PIPES] === true
  );
}
