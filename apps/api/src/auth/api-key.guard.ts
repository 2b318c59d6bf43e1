import { CanActivate, ExecutionContext, HttpStatus, Inject, Injectable } from '@nestjs/common';
import { ProblemException, ProblemTypes } from '@app/problem';
import type { Request } from 'express';
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { ApiKeyEntry } from './api-keys';
import { setPrincipal } from './principal';

export const API_KEYS = 'auth:api-keys';

const digest = (value: string): Buffer => createHash('sha256').update(value).digest();

/**
 * `Authorization: Bearer <key>` → the tenant that owns the key. Keys are
 * compared as SHA-256 digests with timingSafeEqual, against every configured
 * key without stopping at a match, so timing tells nothing about which keys
 * exist.
 */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  private readonly keys: readonly { digest: Buffer; tenant: string }[];

  constructor(@Inject(API_KEYS) entries: readonly ApiKeyEntry[]) {
    this.keys = entries.map((e) => ({ digest: digest(e.key), tenant: e.tenant }));
  }

  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<Request>();
    const presented = bearerToken(req);
    if (presented === undefined) throw unauthorized('Send one Authorization: Bearer <api key> header.');
    const tenant = this.tenantOfKey(presented);
    if (tenant === undefined) throw unauthorized('The API key is not valid.');
    setPrincipal(req, { tenant });
    return true;
  }

  /** The tenant of the request's API key, or undefined; for what must know before the guards run. */
  tenantOf(req: IncomingMessage): string | undefined {
    const presented = bearerToken(req);
    return presented === undefined ? undefined : this.tenantOfKey(presented);
  }

  private tenantOfKey(presented: string): string | undefined {
    const given = digest(presented);
    let tenant: string | undefined;
    for (const key of this.keys) {
      if (timingSafeEqual(key.digest, given) && tenant === undefined) tenant = key.tenant;
    }
    return tenant;
  }
}

/**
 * The token of the request's `Authorization: Bearer <token>`, or undefined:
 * no header, another scheme, or several Authorization headers. Node keeps only
 * the first of several in `req.headers`, while a proxy in front may have read
 * another, so two are refused rather than one of them believed.
 */
export function bearerToken(req: IncomingMessage): string | undefined {
  const values = req.headersDistinct.authorization;
  if (values?.length !== 1) return undefined;
  const match = /^Bearer[ ]+(\S+)\s*$/i.exec(values[0]);
  return match?.[1];
}

function unauthorized(detail: string): ProblemException {
  return new ProblemException({
    type: ProblemTypes.unauthorized,
    title: 'Authentication required',
    status: HttpStatus.UNAUTHORIZED,
    detail,
    headers: { 'WWW-Authenticate': 'Bearer' },
  });
}
