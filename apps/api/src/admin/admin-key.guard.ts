import { CanActivate, HttpStatus, Inject, Injectable, type ExecutionContext } from '@nestjs/common';
import { ProblemException, ProblemTypes } from '@app/problem';
import type { Request } from 'express';
import { createHash, timingSafeEqual } from 'node:crypto';
import { bearerToken } from '../auth/api-key.guard';

export const ADMIN_API_KEY = 'admin:api-key';

/**
 * `Authorization: Bearer <ADMIN_API_KEY>`, compared in constant time. Tenant
 * keys get nowhere here; with no admin key configured nothing does.
 */
@Injectable()
export class AdminKeyGuard implements CanActivate {
  private readonly digest: Buffer | undefined;

  constructor(@Inject(ADMIN_API_KEY) key: string | undefined) {
    this.digest = key === undefined ? undefined : sha256(key);
  }

  canActivate(context: ExecutionContext): boolean {
    const presented = bearerToken(context.switchToHttp().getRequest<Request>());
    if (this.digest && presented !== undefined && timingSafeEqual(this.digest, sha256(presented))) return true;
    throw new ProblemException({
      type: ProblemTypes.unauthorized,
      title: 'Admin authentication required',
      status: HttpStatus.UNAUTHORIZED,
      detail: this.digest
        ? 'Send one Authorization: Bearer <admin api key> header.'
        : 'The admin API is off: ADMIN_API_KEY is not set.',
      headers: { 'WWW-Authenticate': 'Bearer realm="admin"' },
    });
  }
}

function sha256(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}
