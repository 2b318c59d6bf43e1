import { DynamicModule, Module } from '@nestjs/common';
import { OperationsModule } from '@app/operations';
import { PersistenceModule } from '@app/persistence';
import { RedisModule } from '@app/redis';
import { SummaryQueueModule } from '@app/summary-queue';
import type { AdminConfig } from './admin.config';

/** What the CLI needs: Redis, PostgreSQL, the operations. No HTTP server, no metrics. */
@Module({})
export class AdminCliModule {
  static forRoot(config: AdminConfig): DynamicModule {
    return {
      module: AdminCliModule,
      imports: [
        RedisModule.forRoot({
          url: config.redisUrl,
          clusterNodes: config.redisClusterNodes,
          connectionName: 'admin-cli',
          isGlobal: true,
        }),
        PersistenceModule.forRoot({ url: config.databaseUrl, applicationName: 'admin-cli', poolSize: 2 }),
        SummaryQueueModule.forRoot({ partitions: config.jobStreamPartitions, isGlobal: true }),
        OperationsModule,
      ],
    };
  }
}
