import { DynamicModule, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { dataSourceOptions, PersistenceOptions } from './data-source-options';

/**
 * The PostgreSQL DataSource (TypeORM), global to the app. Schema changes go
 * through migrations only (`npm run migration:run`), never `synchronize`.
 * A plain static forRoot: it only passes its options through to TypeOrmModule.
 */
@Module({})
export class PersistenceModule {
  static forRoot(options: PersistenceOptions): DynamicModule {
    return {
      module: PersistenceModule,
      imports: [
        TypeOrmModule.forRoot({
          ...dataSourceOptions(options),
          retryAttempts: 5,
          retryDelay: 1000,
        }),
      ],
      exports: [TypeOrmModule],
    };
  }
}
