import { createParamDecorator, ExecutionContext, UnauthorizedException } from '@nestjs/common';

export interface Principal {
  readonly tenant: string;
}

const PRINCIPAL = Symbol('auth:principal');

export function setPrincipal(request: object, principal: Principal): void {
  Object.defineProperty(request, PRINCIPAL, { value: principal, configurable: true });
}

export function principalOf(request: object): Principal | undefined {
  return (request as { [PRINCIPAL]?: Principal })[PRINCIPAL];
}

/**
 * The tenant the guard authenticated. Throws rather than answering for
 * nobody: a route that reads the tenant without the guard is a bug.
 */
export function requireTenant(request: object): string {
  const principal = principalOf(request);
  if (!principal) throw new UnauthorizedException();
  return principal.tenant;
}

/** The authenticated tenant, as a handler parameter. */
export const Tenant = createParamDecorator((_: unknown, ctx: ExecutionContext): string =>
  requireTenant(ctx.switchToHttp().getRequest<object>()),
);
