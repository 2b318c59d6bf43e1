import { CanActivate, ExecutionContext, Injectable } from '@nestjs/common';
import { ROUTE_ARGS_METADATA } from '@nestjs/common/constants';
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum';
import { ProblemDocument, ProblemException } from './problem';
import { unknownFieldsProblem } from './request-validation.pipe';

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

type Class = abstract new (...args: never[]) => unknown;
/** Types a @Body() may have that are no DTO, as Nest's ValidationPipe has them. */
const NOT_DTOS = new Set<unknown>([String, Boolean, Number, Array, Object, Buffer, Date]);

/**
 * The DTO class of the handler's whole-body parameter (`@Body() body: Dto`),
 * or undefined: read from the metadata Nest's own parameter decorators and
 * TypeScript's emitDecoratorMetadata leave, as @nestjs/swagger reads it.
 */
function bodyDtoOf(controller: Class, handler: (...args: never[]) => unknown): Class | undefined {
  const params = (Reflect.getMetadata(ROUTE_ARGS_METADATA, controller, handler.name) ?? {}) as Record<
    string,
    { index: number; data?: unknown }
  >;
  const types = (Reflect.getMetadata('design:paramtypes', controller.prototype as object, handler.name) ??
    []) as unknown[];
  for (const [key, param] of Object.entries(params)) {
    if (Number(key.split(':')[0]) !== RouteParamtypes.BODY || param.data !== undefined) continue;
    const type = types[param.index];
    return typeof type === 'function' && !NOT_DTOS.has(type) ? (type as Class) : undefined;
  }
  return undefined;
}

/**
 * The first global guard: before any other guard, interceptor (the
 * idempotency claim, which fingerprints the whole body) or pipe does any
 * work on the body, it refuses one that was refused by the parser or the
 * JSON limits, and one with fields its route's body DTO does not declare
 * (one pass over the parsed body). A refused body never claims a key or
 * reaches a handler.
 */
@Injectable()
export class BodyRejectionGuard implements CanActivate {
  private readonly dtos = new WeakMap<object, Class | null>();

  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const req = context.switchToHttp().getRequest<{ body?: unknown }>();
    const problem = bodyRejectionOf(req);
    if (problem) throw new ProblemException(problem);
    if (typeof req.body !== 'object' || req.body === null || Array.isArray(req.body)) return true;
    const dto = this.dtoOf(context);
    const unknown = dto ? unknownFieldsProblem(req.body, dto) : undefined;
    if (unknown) throw unknown;
    return true;
  }

  private dtoOf(context: ExecutionContext): Class | undefined {
    const handler = context.getHandler();
    let dto = this.dtos.get(handler);
    if (dto === undefined) {
      dto = bodyDtoOf(context.getClass(), handler as (...args: never[]) => unknown) ?? null;
      this.dtos.set(handler, dto);
    }
    return dto ?? undefined;
  }
}
