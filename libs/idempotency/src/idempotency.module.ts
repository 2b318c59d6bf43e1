import { BeforeApplicationShutdown, Inject, Module, OnApplicationBootstrap, Provider } from '@nestjs/common';
import { APP_INTERCEPTOR, DiscoveryModule } from '@nestjs/core';
import { IdempotencyInterceptor } from './idempotency.interceptor';
import { IdempotencyMetrics } from './idempotency.metrics';
import {
  IDEMPOTENCY_MODULE_OPTIONS,
  type IdempotencyModuleOptions,
  ConfigurableModuleClass,
} from './idempotency.module-definition';
import { IdempotencyStore } from './idempotency-store.interface';
import { IdempotentRoutesValidator } from './idempotent-routes.validator';

/** What a store may do beside the contract: background work that starts and stops with the application. */
type StoreWithLifecycle = IdempotencyStore & { startSweeping?: () => void; close?: () => Promise<void> };

const storeProvider: Provider = {
  provide: IdempotencyStore,
  inject: [IDEMPOTENCY_MODULE_OPTIONS],
  useFactory: (options: IdempotencyModuleOptions) => options.store,
};

/**
 * Registers IdempotencyInterceptor for the whole application; it acts only on
 * routes marked @Idempotent(), so protecting a new method is one decorator.
 *
 *   IdempotencyModule.forRootAsync({
 *     inject: [REDIS_CLIENT],
 *     useFactory: (redis) => ({ store: new RedisIdempotencyStore(redis), scope: (req) => tenantOf(req) }),
 *   })
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    storeProvider,
    IdempotencyMetrics,
    IdempotencyInterceptor,
    IdempotentRoutesValidator,
    { provide: APP_INTERCEPTOR, useExisting: IdempotencyInterceptor },
  ],
  exports: [IdempotencyStore, IdempotencyInterceptor],
})
export class IdempotencyModule
  extends ConfigurableModuleClass
  implements OnApplicationBootstrap, BeforeApplicationShutdown
{
  constructor(
    @Inject(IdempotencyStore) private readonly store: StoreWithLifecycle,
    @Inject(IDEMPOTENCY_MODULE_OPTIONS) private readonly options: IdempotencyModuleOptions,
  ) {
    super();
  }

  /**
   * A store's sweep of expired records (the PostgreSQL store's) starts once
   * the application has started, not when the store is made: an application
   * whose start fails (a route naming a store it lacks) is never closed, and
   * a sweep begun in its factory would run on, holding a connection open.
   */
  onApplicationBootstrap(): void {
    for (const store of this.allStores()) store.startSweeping?.();
  }

  /**
   * A store's own connections (the Redis store's blocking one for following
   * frames), closed as shutdown begins: a duplicate following a request that
   * runs elsewhere lets go at once (its caller gets the broken-stream frame
   * or a 409, and its retry reaches another instance) instead of holding the
   * server's close for as long as that request runs. Recordings of this
   * instance write on through the store's own client.
   */
  async beforeApplicationShutdown(): Promise<void> {
    await Promise.all(this.allStores().map((store) => store.close?.() ?? Promise.resolve()));
  }

  private allStores(): StoreWithLifecycle[] {
    return [...new Set<StoreWithLifecycle>([this.store, ...Object.values(this.options.stores ?? {})])];
  }
}
