import { Injectable } from '@nestjs/common';
import { HealthIndicatorService } from '@nestjs/terminus';
import { DataSource } from 'typeorm';

/**
 * PostgreSQL answers, and its schema is the one this build expects: every
 * migration the app ships is applied. A pod of a new release started before
 * the migration Job has finished stays unready (and takes no traffic, and its
 * worker's jobs are not failed by a missing table) until the schema catches up.
 * One query, as cheap as `SELECT 1`.
 */
@Injectable()
export class PostgresHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    private readonly dataSource: DataSource,
  ) {}

  check(timeoutMs = 1000) {
    return this.health
      .check('postgres')
      .attempt(async () => {
        const expected = this.dataSource.migrations.map((m) => m.name ?? m.constructor.name);
        if (expected.length === 0) {
          await this.dataSource.query('SELECT 1');
          return;
        }
        const table = this.dataSource.options.migrationsTableName ?? 'migrations';
        const rows = await this.dataSource
          .query<{ applied: string[] | null }[]>(
            `SELECT array_agg(name) AS applied FROM ${table} WHERE name = ANY($1)`,
            [expected],
          )
          .catch((err: { code?: string; driverError?: { code?: string } }) => {
            // 42P01: no migrations table yet.
            if ((err.driverError?.code ?? err.code) === '42P01') return [{ applied: [] }];
            throw err;
          });
        const applied = new Set(rows[0]?.applied ?? []);
        const missing = expected.filter((name) => !applied.has(name));
        if (missing.length > 0)
          throw new Error(
            `schema not migrated: ${missing.join(', ')} not applied (npm run migration:run, or the migration Job)`,
          );
      })
      .withTimeout(timeoutMs);
  }
}
