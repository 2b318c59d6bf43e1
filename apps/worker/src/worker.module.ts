import { DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { HealthModule } from '@app/health';
import { LoggingModule, MetricsModule } from '@app/observability';
import { PersistenceModule } from '@app/persistence';
import { ProblemDetailsFilter } from '@app/problem';
import { RedisModule } from '@app/redis';
import type { WorkerConfig } from './worker.config';

@Module({})
export class WorkerModule {
  static forRoot(config: WorkerConfig): DynamicModule {
    return {
      module: WorkerModule,
      imports: [
        LoggingModule.forRoot({ level: config.logLevel, app: 'worker' }),
        MetricsModule,
        RedisModule.forRoot({ url: config.redisUrl, connectionName: 'worker', isGlobal: true }),
        PersistenceModule.forRoot({ url: config.databaseUrl, applicationName: 'worker' }),
        HealthModule,
      ],
      providers: [{ provide: APP_FILTER, useClass: ProblemDetailsFilter }],
    };
  }
}
