import { DynamicModule, Module } from '@nestjs/common';
import { API_KEYS, ApiKeyGuard, INTERNAL_API_KEY } from './api-key.guard';
import type { ApiKeyEntry } from './api-keys';

/** Provides ApiKeyGuard for `@UseGuards(ApiKeyGuard)` anywhere in the api. */
@Module({})
export class AuthModule {
  /** `internalKey`: INTERNAL_API_KEY, taken only with X-Tenant (ApiKeyGuard); unset, no request may send X-Tenant. */
  static forRoot(keys: readonly ApiKeyEntry[], internalKey?: string): DynamicModule {
    return {
      module: AuthModule,
      global: true,
      providers: [
        { provide: API_KEYS, useValue: keys },
        // A factory: Nest does not take `useValue: undefined` for a value.
        { provide: INTERNAL_API_KEY, useFactory: () => internalKey },
        ApiKeyGuard,
      ],
      // Exported with the keys: @UseGuards(ApiKeyGuard) builds the guard in each controller's own module.
      exports: [ApiKeyGuard, API_KEYS, INTERNAL_API_KEY],
    };
  }
}
