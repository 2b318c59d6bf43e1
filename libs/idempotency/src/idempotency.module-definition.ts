import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { Request } from 'express';
import type { IdempotencyStore } from './idempotency-store.interface';

export interface IdempotencyModuleOptions {
  /** Where records live, e.g. `new RedisIdempotencyStore(redis)`. */
  readonly store: IdempotencyStore;
  /** Further stores by name, for routes that say `@Idempotent({ store: name })`. */
  readonly stores?: Readonly<Record<string, IdempotencyStore>>;
  /**
   * The principal a key belongs to (a tenant), taken from what the guards
   * established, never from a header the client picks. Records of different
   * scopes never meet. Throw (e.g. UnauthorizedException) when there is none.
   */
  readonly scope: (request: Request) => string;
  readonly lockTtlMs?: number;
  readonly resultTtlMs?: number;
  readonly maxStoredBodyBytes?: number;
  /** Response headers that are stored and replayed. Set-Cookie never is. */
  readonly replayHeaders?: readonly string[];
}

export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: IDEMPOTENCY_MODULE_OPTIONS,
  OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  // isGlobal: the store (IdempotencyStore) injectable in every module, for readers of its records.
  .setExtras({ isGlobal: false }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
  .build();
