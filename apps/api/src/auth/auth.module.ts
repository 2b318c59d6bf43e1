import { DynamicModule, Module } from '@nestjs/common';
import { API_KEYS, ApiKeyGuard } from './api-key.guard';
import type { ApiKeyEntry } from './api-keys';

/** Provides ApiKeyGuard for `@UseGuards(ApiKeyGuard)` anywhere in the api. */
@Module({})
export class AuthModule {
  static forRoot(keys: readonly ApiKeyEntry[]): DynamicModule {
    return {
      module: AuthModule,
      global: true,
      providers: [{ provide: API_KEYS, useValue: keys }, ApiKeyGuard],
      exports: [ApiKeyGuard, API_KEYS],
    };
  }
}
