import { CanActivate, ExecutionContext, HttpStatus, Inject, Injectable, Optional } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { headerValues, ProblemException, ProblemTypes } from '@app/problem';
import type { Request } from 'express';
import { hash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { ApiKeyEntry } from './api-keys';
import { setPrincipal } from './principal';

export const API_KEYS = 'auth:api-keys';
/** INTERNAL_API_KEY, or undefined when unset (then nothing may send X-Tenant). */
export const INTERNAL_API_KEY = 'auth:internal-api-key';

/** The header naming the tenant of an internal-key request (lower case: Node's header names). */
export const X_TENANT = 'x-tenant';

/**
 * Marks the routes (a controller or a handler) that take INTERNAL_API_KEY:
 * the gateway's, which the worker's model calls use. Every other route
 * refuses it: the key names any tenant, and nothing but model calls needs
 * that (a refund or a run started for any tenant would be its misuse).
 */
export const AcceptsInternalKey = Reflector.createDecorator<void, true>({ transform: () => true });

/** What a request's key matched, and by which guard, kept on the request while it lives (ApiKeyGuard.matchOnce). */
const MATCHED = Symbol('api-key:matched');
interface Matched {
  readonly guard: object;
  readonly presented: string;
  readonly match: { tenant: string | undefined } | undefined;
}

// One-shot hash(): half the CPU of createHash().update().digest() for a key's few bytes.
const digest = (value: string): Buffer => hash('sha256', value, 'buffer');

/** Who a request's credentials name, or why they name no one (the 401's detail). */
export type Authentication = { readonly tenant: string } | { readonly refused: string };

/**
 * `Authorization: Bearer <key>` → the tenant the request is made for: a
 * tenant key's own tenant, or, for INTERNAL_API_KEY (the worker's model calls
 * through the gateway), the tenant named in `X-Tenant`. Keys are compared as
 * SHA-256 digests with timingSafeEqual, against every configured key (the
 * internal one included) without stopping at a match, so timing tells nothing
 * about which keys exist or which one matched.
 *
 * X-Tenant is honoured from the internal key only, and required with it: a
 * tenant key that could name another tenant would be every tenant's key,
 * and an internal call without a tenant has no scope to be recorded in. Both
 * mistakes are 401, as an unknown key is (the same problem type, so the
 * gateway's envelope says `invalid_api_key`), with a detail that says which:
 * the credentials as sent do not authenticate a tenant, and no retry of them
 * will. X-Tenant must name a tenant of API_KEYS: a run's tenant always is one
 * (runs are started with a tenant key), so any other name is a bug or a
 * forgery, and accepting it would create records, token counts and metric
 * series for a tenant the api does not have. The internal key is taken only
 * where @AcceptsInternalKey() says so (the gateway); elsewhere it is a 401.
 */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  private readonly keys: readonly { digest: Buffer; tenant: string | undefined }[];
  private readonly tenants: ReadonlySet<string>;
  /** Whether a route takes the internal key, by controller class and handler. */
  private readonly internalKeyRoutes = new WeakMap<object, WeakMap<object, boolean>>();

  constructor(
    private readonly reflector: Reflector,
    @Inject(API_KEYS) entries: readonly ApiKeyEntry[],
    @Optional() @Inject(INTERNAL_API_KEY) internalKey?: string,
  ) {
    // The config refuses this at boot; here too, as the guard is what it would break: a tenant key that were
    // also the internal key would match that tenant first, and the internal key would never name another.
    if (internalKey !== undefined && entries.some((e) => e.key === internalKey))
      throw new Error('ApiKeyGuard: INTERNAL_API_KEY must differ from every tenant key');
    this.keys = [
      ...entries.map((e) => ({ digest: digest(e.key), tenant: e.tenant })),
      // tenant undefined: the internal key, whose tenant the request names.
      ...(internalKey === undefined ? [] : [{ digest: digest(internalKey), tenant: undefined }]),
    ];
    this.tenants = new Set(entries.map((e) => e.tenant));
  }

  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<Request>();
    const internalKey = this.acceptsInternalKey(context.getClass(), context.getHandler());
    const auth = this.authenticate(req, { internalKey });
    if ('refused' in auth) throw unauthorized(auth.refused);
    setPrincipal(req, { tenant: auth.tenant });
    return true;
  }

  /** @AcceptsInternalKey() of the handler or its class: read from the metadata once per class and handler. */
  private acceptsInternalKey(controller: object, handler: object): boolean {
    let byHandler = this.internalKeyRoutes.get(controller);
    if (!byHandler) this.internalKeyRoutes.set(controller, (byHandler = new WeakMap()));
    let accepts = byHandler.get(handler);
    if (accepts === undefined) {
      accepts =
        this.reflector.getAllAndOverride(AcceptsInternalKey, [handler as () => void, controller as () => void]) ===
        true;
      byHandler.set(handler, accepts);
    }
    return accepts;
  }

  /**
   * The tenant the request is authenticated for, or undefined; for what must
   * know before the guards run. `internalKey`: whether the route takes it.
   */
  tenantOf(req: IncomingMessage, options: { readonly internalKey: boolean }): string | undefined {
    const auth = this.authenticate(req, options);
    return 'tenant' in auth ? auth.tenant : undefined;
  }

  /** The one decision: the request's Authorization and X-Tenant, and whether the route takes the internal key. */
  authenticate(req: IncomingMessage, { internalKey }: { readonly internalKey: boolean }): Authentication {
    const presented = bearerToken(req);
    if (presented === undefined) return { refused: 'Send one Authorization: Bearer <api key> header.' };
    const match = this.matchOnce(req, presented);
    const claimed = headerValues(req, X_TENANT);
    if (match === undefined) return { refused: 'The API key is not valid.' };
    if (match.tenant !== undefined) {
      return claimed === undefined
        ? { tenant: match.tenant }
        : { refused: 'X-Tenant is accepted only with the internal key; a tenant key names its own tenant.' };
    }
    if (!internalKey) return { refused: 'The internal key is accepted on the model gateway only.' };
    if (claimed === undefined) return { refused: 'The internal key must name the tenant in one X-Tenant header.' };
    if (claimed.length !== 1) return { refused: 'Send one X-Tenant header.' };
    const tenant = claimed[0].trim();
    if (!this.tenants.has(tenant)) return { refused: 'X-Tenant must name a tenant of API_KEYS.' };
    return { tenant };
  }

  /**
   * match(), once per request: a gateway request is authenticated before its body is read (which body limit
   * applies) and again by the guard, and the key's digest and comparisons are most of what either costs.
   */
  private matchOnce(req: IncomingMessage, presented: string): { tenant: string | undefined } | undefined {
    const request = req as IncomingMessage & { [MATCHED]?: Matched };
    const known = request[MATCHED];
    // This guard's own: another guard instance (another key set, a test's) matches for itself.
    if (known !== undefined && known.guard === this && known.presented === presented) return known.match;
    const match = this.match(presented);
    // On the request, not in a WeakMap keyed by it: a WeakMap entry a request costs more than the lookup saves.
    request[MATCHED] = { guard: this, presented, match };
    return match;
  }

  /** The entry whose key was presented: every key is compared, whether or not one matched already. */
  private match(presented: string): { tenant: string | undefined } | undefined {
    const given = digest(presented);
    let found: { tenant: string | undefined } | undefined;
    for (const key of this.keys) {
      if (timingSafeEqual(key.digest, given) && found === undefined) found = { tenant: key.tenant };
    }
    return found;
  }
}

/**
 * The token of the request's `Authorization: Bearer <token>`, or undefined:
 * no header, another scheme, or several Authorization headers. Node keeps only
 * the first of several in `req.headers`, while a proxy in front may have read
 * another, so two are refused rather than one of them believed.
 */
export function bearerToken(req: Pick<IncomingMessage, 'rawHeaders'>): string | undefined {
  const values = headerValues(req, 'authorization');
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
