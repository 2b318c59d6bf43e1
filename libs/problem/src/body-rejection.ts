import { CanActivate, ExecutionContext, Injectable } from '@nestjs/common';
import { ProblemDocument, ProblemException } from './problem';

const REJECTION = Symbol('problem:body-rejection');

/**
 * Records why the request body was refused (the body parser failed, or the
 * JSON is past a limit), for BodyRejectionGuard to raise. Express-level body
 * middleware runs before the logging, request-id and metrics middleware that
 * Nest mounts, so an answer sent from there would be invisible: no access log
 * line, no X-Request-Id, no latency observation. Raised from a guard, the
 * refusal goes through the exception filter like any other error, after all
 * of those have seen the request.
 */
export function rejectBody(req: object, problem: ProblemDocument): void {
  Object.defineProperty(req, REJECTION, { value: problem, configurable: true });
}

export function bodyRejectionOf(req: object): ProblemDocument | undefined {
  return (req as { [REJECTION]?: ProblemDocument })[REJECTION];
}

/**
 * The first global guard: a request whose body was refused gets that problem
 * before any other guard, interceptor (the idempotency claim) or pipe sees
 * the request, so a refused body never claims a key or reaches a handler.
 */
@Injectable()
export class BodyRejectionGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const problem = bodyRejectionOf(context.switchToHttp().getRequest<object>());
    if (problem) throw new ProblemException(problem);
    return true;
  }
}
