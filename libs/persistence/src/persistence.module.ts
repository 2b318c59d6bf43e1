import { DynamicModule, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { dataSourceOptions, PersistenceOptions } from './data-source-options';
import { OutboxAdminRepository } from './repositories/outbox-admin.repository';
import { RefundRepository } from './refunds/refund.repository';
import { SummaryRepository } from './repositories/summary.repository';
import { SummaryWriter } from './summary-writer.service';

/**
 * The PostgreSQL DataSource (TypeORM) and the repositories, global to the app. Schema changes go
 * through migrations only (`npm run migration:run`), never `synchronize`.
 * A plain static forRoot: it only passes its options through to TypeOrmModule.
 */
@Module({})
export class PersistenceModule {
  static forRoot(options: PersistenceOptions): DynamicModule {
    return {
      module: PersistenceModule,
      global: true,
      imports: [
        TypeOrmModule.forRoot({
          ...dataSourceOptions(options),
          retryAttempts: 5,
          retryDelay: 1000,
        }),
      ],
      providers: [SummaryRepository, OutboxAdminRepository, SummaryWriter, RefundRepository],
      exports: [TypeOrmModule, SummaryRepository, OutboxAdminRepository, SummaryWriter, RefundRepository],
    };
  }
}
