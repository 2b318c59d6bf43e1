import type { DynamicModule, ModuleMetadata, Type } from '@nestjs/common';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { Test, type TestingModuleBuilder } from '@nestjs/testing';
import { useExpressPrototypes } from '@app/http';
import { DirectAnswerExpressAdapter } from '@app/idempotency';
import { REDIS_CLIENT, type RedisClient } from '@app/redis';
import type { Redis } from 'ioredis';
import type { Server } from 'node:http';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { configureApiApp } from '../../apps/api/src/create-api-app';
import { testDatabaseUrl, testRedisUrl } from './infra';

export const TENANT_A = { tenant: 'tenant-a', key: 'key-a-0123456789abcdef' } as const;
export const TENANT_B = { tenant: 'tenant-b', key: 'key-b-0123456789abcdef' } as const;
export const bearer = (t: { key: string }): string => `Bearer ${t.key}`;

export interface ApiHarness {
  readonly app: NestExpressApplication;
  readonly server: Server;
  /** The app's own Redis client (an ioredis Cluster when REDIS_CLUSTER_NODES is set: see `client`). */
  readonly redis: Redis;
  /** The same client, typed as what it may be: one Redis or a Cluster. */
  readonly client: RedisClient;
  close(): Promise<void>;
}

export interface ApiHarnessOptions {
  /** Variables on top of the test defaults, as an operator would set them. */
  readonly env?: Record<string, string>;
  /** Extra modules, e.g. a feature module with test controllers. */
  readonly imports?: ModuleMetadata['imports'];
  /** Modules imported before the api's: their app-wide interceptors run outside the api's own. */
  readonly outerImports?: ModuleMetadata['imports'];
  /** Provider overrides (fault injection around real implementations). */
  readonly override?: (builder: TestingModuleBuilder) => TestingModuleBuilder;
  /** Nest's own Express adapter instead of the api's (which writes replays straight to the response). */
  readonly nestAdapter?: boolean;
}

/** The api as main.ts builds it, on this worker's Redis and PostgreSQL databases. */
export async function startApi(options: ApiHarnessOptions = {}): Promise<ApiHarness> {
  const config = loadApiConfig({
    REDIS_URL: testRedisUrl(),
    DATABASE_URL: testDatabaseUrl(),
    LOG_LEVEL: 'silent',
    API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key},${TENANT_B.tenant}:${TENANT_B.key}`,
    ...options.env,
  });
  const imports: (DynamicModule | Type)[] = [
    ...((options.outerImports ?? []) as Type[]),
    ApiModule.forRoot(config),
    ...((options.imports ?? []) as Type[]),
  ];
  let builder = Test.createTestingModule({ imports });
  if (options.override) builder = options.override(builder);
  const moduleRef = await builder.compile();
  // The adapter main.ts gives the api: replays are written straight to the response.
  const adapter = options.nestAdapter ? new ExpressAdapter() : new DirectAnswerExpressAdapter();
  // As createHttpApp makes main.ts's app: these options, the server making requests with Express's prototypes.
  const app = moduleRef.createNestApplication<NestExpressApplication>(adapter, { bodyParser: false, bufferLogs: true });
  if (!useExpressPrototypes(app)) throw new Error("the api's server could not make requests with Express's prototypes");
  configureApiApp(app);
  try {
    await app.init();
  } catch (err) {
    // A start the app refuses (a test of exactly that) leaves no Redis or PostgreSQL connection open behind it.
    await app.close().catch(() => undefined);
    throw err;
  }
  return {
    app,
    server: app.getHttpServer(),
    redis: app.get<Redis>(REDIS_CLIENT),
    client: app.get<RedisClient>(REDIS_CLIENT),
    close: () => app.close(),
  };
}
