import { DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { HealthModule, PostgresHealthIndicator } from '@app/health';
import { LoggingModule, MetricsModule } from '@app/observability';
import { TracingModule, tracingOn } from '@app/tracing';
import { PersistenceModule } from '@app/persistence';
import { ProblemDetailsFilter } from '@app/problem';
import { OutboxRelayModule } from './outbox/outbox-relay.module';
import type { RelayConfig } from './relay.config';

@Module({})
export class RelayModule {
  static forRoot(config: RelayConfig): DynamicModule {
    return {
      module: RelayModule,
      imports: [
        LoggingModule.forRoot({ level: config.logLevel, app: 'relay' }),
        TracingModule,
        MetricsModule,
        PersistenceModule.forRoot({ url: config.databaseUrl, applicationName: 'relay' }),
        // PostgreSQL only: the relay has no Redis, so it neither checks nor opens it
        // (its LISTEN connection registers its own readiness check).
        HealthModule.forRoot({ readiness: [PostgresHealthIndicator] }),
        OutboxRelayModule.forRoot({
          databaseUrl: config.databaseUrl,
          webhookUrl: config.notifyWebhookUrl,
          sendTimeoutMs: config.notifyTimeoutMs,
          leaseMs: config.outboxLeaseMs,
          batch: config.outboxBatch,
          maxAttempts: config.outboxMaxAttempts,
          pollMs: config.outboxPollMs,
          backoffBaseMs: config.outboxBackoffBaseMs,
          backoffMaxMs: config.outboxBackoffMaxMs,
          retentionDays: config.outboxRetentionDays,
          traced: tracingOn(config),
        }),
      ],
      providers: [{ provide: APP_FILTER, useClass: ProblemDetailsFilter }],
    };
  }
}
