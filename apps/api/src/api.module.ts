import { DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER, APP_PIPE } from '@nestjs/core';
import { HealthModule, PostgresHealthIndicator, RedisHealthIndicator } from '@app/health';
import { DEFAULT_REPLAY_HEADERS, IdempotencyModule, RedisIdempotencyStore } from '@app/idempotency';
import { LoggingModule, MetricsModule } from '@app/observability';
import { TracingModule } from '@app/tracing';
import { PersistenceModule, PostgresIdempotencyStore } from '@app/persistence';
import { ProblemDetailsFilter, RequestValidationPipe } from '@app/problem';
import { type Durability, REDIS_CLIENT, REDIS_DURABILITY, RedisModule, type RedisClient } from '@app/redis';
import { SummaryQueueModule } from '@app/summary-queue';
import { WorkflowsModule } from '@app/workflows';
import { DataSource } from 'typeorm';
import { type ApiConfig, gatewayDrainMs } from './api.config';
import { AdminModule } from './admin/admin.module';
import { AuthModule } from './auth/auth.module';
import { GATEWAY_UPSTREAM_HEADER } from './gateway/chat-completions.relay';
import { GatewayModule } from './gateway/gateway.module';
import { requireTenant } from './auth/principal';
import { RefundsModule } from './refunds/refunds.module';
import { RunsModule } from './runs/runs.module';
import { SummariesModule } from './summaries/summaries.module';
import { TriageModule } from './triage/triage.module';

/**
 * Both stores, by name, for routes that choose one (`@Idempotent({ store:
 * 'postgres' })`: a route that finalises its record in its own transaction);
 * IDEMPOTENCY_STORE picks the default for every other route. The PostgreSQL
 * store runs on the api's own DataSource: its pool, timeouts and readiness
 * check already cover PostgreSQL, so the store adds one connection per
 * process (its LISTEN, opened when a duplicate first follows a running
 * request), not a second pool. Its sweep starts with the application and stops
 * with it (IdempotencyModule starts and closes every store).
 */
function idempotencyStores(
  config: ApiConfig,
  redis: RedisClient,
  durability: Durability | undefined,
  dataSource: DataSource,
) {
  const stores = {
    // On a cluster a claim and a stored answer wait for a replica, as the job does (RedisModule's durability).
    redis: new RedisIdempotencyStore(redis, { durability }),
    postgres: new PostgresIdempotencyStore(dataSource, { listenApplicationName: 'api-idempotency-listen' }),
  };
  return { store: stores[config.idempotencyStore], stores };
}

@Module({})
export class ApiModule {
  static forRoot(config: ApiConfig): DynamicModule {
    return {
      module: ApiModule,
      imports: [
        LoggingModule.forRoot({ level: config.logLevel, app: 'api' }),
        TracingModule,
        MetricsModule,
        RedisModule.forRoot({
          url: config.redisUrl,
          clusterNodes: config.redisClusterNodes,
          durabilityMode: config.redisDurability,
          connectionName: 'api',
          isGlobal: true,
        }),
        PersistenceModule.forRoot({ url: config.databaseUrl, applicationName: 'api' }),
        HealthModule.forRoot({ readiness: [RedisHealthIndicator, PostgresHealthIndicator] }),
        AuthModule.forRoot(config.apiKeys, config.internalApiKey),
        IdempotencyModule.forRootAsync({
          // The gateway reads its responses' records (GET /v1/responses/<id>).
          isGlobal: true,
          inject: [REDIS_CLIENT, { token: REDIS_DURABILITY, optional: true }, DataSource],
          useFactory: (redis: RedisClient, durability: Durability | undefined, dataSource: DataSource) => ({
            ...idempotencyStores(config, redis, durability, dataSource),
            scope: requireTenant,
            lockTtlMs: config.idempotencyLockTtlMs,
            resultTtlMs: config.idempotencyResultTtlMs,
            // A gateway answer's replay names the upstream that made it, as the answer did.
            replayHeaders: [...DEFAULT_REPLAY_HEADERS, GATEWAY_UPSTREAM_HEADER],
          }),
        }),
        SummaryQueueModule.forRoot({ partitions: config.jobStreamPartitions, isGlobal: true }),
        SummariesModule,
        // The workflows the api starts and reads (GET /v1/runs), on the partitions the worker consumes.
        WorkflowsModule.forClient({
          workflows: ['triage', { name: 'summaries', queue: 'summaries' }],
          partitions: config.jobStreamPartitions,
          isGlobal: true,
        }),
        TriageModule,
        RunsModule,
        RefundsModule.forRoot({
          paymentsUrl: config.paymentsUrl,
          paymentsTimeoutMs: config.paymentsTimeoutMs,
          production: config.nodeEnv === 'production',
        }),
        GatewayModule.forRoot({
          timeoutMs: config.gatewayTimeoutMs,
          // Part of the api's drain (apiDrainMs), which the manifests' grace periods cover.
          drainMs: gatewayDrainMs(config),
          tenants: [...new Set(config.apiKeys.map((entry) => entry.tenant))],
          provider: { provider: config.llmProvider, apiKey: config.openaiApiKey, baseUrl: config.openaiBaseUrl },
          upstreams: config.gatewayUpstreams,
          tokenLimits: config.tenantTokenLimits,
          store: config.idempotencyStore,
          recordTtlMs: config.idempotencyResultTtlMs,
        }),
        AdminModule.forRoot(config.adminApiKey),
      ],
      providers: [
        { provide: APP_FILTER, useClass: ProblemDetailsFilter },
        { provide: APP_PIPE, useClass: RequestValidationPipe },
      ],
    };
  }
}
