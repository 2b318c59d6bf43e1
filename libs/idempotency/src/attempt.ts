import type { IdempotencyRequestContext } from './idempotency-context';
import type { ClaimResult, IdempotencyStore } from './idempotency-store.interface';
import type { IdempotencyModuleOptions } from './idempotency.module-definition';
import type { IdempotentOptions } from './idempotent.decorator';
import { type SettleRoute, storesByDefault } from './settle-decision';

/*
 * What one keyed request carries through the interceptor's parts: the
 * route's settings as resolved for it, and the attempt (its context, its
 * lock token, its key's hash for logs).
 */

export const DEFAULT_LOCK_TTL_MS = 10_000;
export const DEFAULT_RESULT_TTL_MS = 86_400_000;
export const DEFAULT_MAX_STORED_BODY_BYTES = 256 * 1024;
export const DEFAULT_REPLAY_HEADERS: readonly string[] = [
  'location',
  'content-type',
  'content-language',
  'content-location',
  'etag',
  'last-modified',
  'link',
  'cache-control',
];
const NEVER_REPLAYED = new Set(['set-cookie', 'set-cookie2', 'authorization', 'www-authenticate']);

/** A route's @Idempotent() options with the module's defaults filled in. */
export interface RouteSettings extends SettleRoute {
  readonly required: boolean;
  readonly lockTtlMs: number;
  readonly resultTtlMs: number;
  readonly attachWaitMs: number | undefined;
  readonly store: IdempotencyStore;
  readonly recover: IdempotentOptions['recover'];
  readonly acceptsRunScope: boolean;
}

export type InProgress = Extract<ClaimResult, { outcome: 'in-progress' }>;

export interface Attempt {
  readonly context: IdempotencyRequestContext;
  readonly token: string;
  readonly settings: RouteSettings;
  /** The key, hashed: keys are client secrets of a kind and stay out of logs. */
  readonly keyHash: string;
  /** The route's handler: whose run times tell a duplicate when to come back. */
  readonly handler: object;
  /** Whether a record's stored fingerprint names this request's body, whichever version wrote it (sameFingerprint). */
  readonly sameBody: (storedFingerprint: string) => boolean;
}

/** The headers a stored answer keeps: the module's allowlist, lower-cased, never a credential or a cookie. */
export function replayHeaderAllowlist(options: IdempotencyModuleOptions): ReadonlySet<string> {
  return new Set(
    (options.replayHeaders ?? DEFAULT_REPLAY_HEADERS).map((h) => h.toLowerCase()).filter((h) => !NEVER_REPLAYED.has(h)),
  );
}

/** The route's settings: its own options, else the module's, else the defaults. */
export function routeSettings(
  route: IdempotentOptions,
  options: IdempotencyModuleOptions,
  defaultStore: IdempotencyStore,
  replayHeaders: ReadonlySet<string>,
): RouteSettings {
  return {
    required: route.required ?? true,
    lockTtlMs: route.lockTtlMs ?? options.lockTtlMs ?? DEFAULT_LOCK_TTL_MS,
    resultTtlMs: route.resultTtlMs ?? options.resultTtlMs ?? DEFAULT_RESULT_TTL_MS,
    maxStoredBodyBytes: route.maxStoredBodyBytes ?? options.maxStoredBodyBytes ?? DEFAULT_MAX_STORED_BODY_BYTES,
    storesStatus: route.storesStatus ?? storesByDefault,
    attachWaitMs: route.attach?.waitMs,
    errors: route.errors,
    replayHeaders,
    store: storeNamed(route.store, options, defaultStore),
    recover: route.recover,
    acceptsRunScope: route.acceptsRunScope === true,
  };
}

/** The module's store, or one of its named stores (IdempotentRoutesValidator checks the names at start-up). */
function storeNamed(
  name: string | undefined,
  options: IdempotencyModuleOptions,
  defaultStore: IdempotencyStore,
): IdempotencyStore {
  if (name === undefined) return defaultStore;
  const store = options.stores?.[name];
  if (!store) throw new Error(`Idempotency: no store named "${name}" in IdempotencyModule's stores`);
  return store;
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
