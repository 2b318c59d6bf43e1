import { errorCodeOf } from '@app/persistence';

/**
 * The schema a migration has not created yet: while the migration Job of a
 * rollout still runs, new workers may already take jobs. Worth a redelivery;
 * MAX_DELIVERIES still bounds a migration that never comes.
 * 42P01 undefined_table, 42703 undefined_column, 42883 undefined_function,
 * 42704 undefined_object (a type, an index), 3F000 invalid_schema_name.
 */
const SCHEMA_NOT_READY = new Set(['42P01', '42703', '42883', '42704', '3F000']);

/**
 * PostgreSQL being unreachable or busy, or its schema not migrated yet: worth
 * a redelivery. SQLSTATE classes 08 (connection), 53 (resources), 57
 * (operator intervention), 40001/40P01, a schema not migrated yet, and socket errors.
 */
export function isTransientDatabaseError(err: unknown): boolean {
  const code = errorCodeOf(err);
  if (/^(08|53|57)/.test(code) || code === '40001' || code === '40P01') return true;
  if (SCHEMA_NOT_READY.has(code)) return true;
  if (/^E[A-Z]+$/.test(code)) return true; // ECONNREFUSED, ECONNRESET, ...
  const message = err instanceof Error ? err.message : '';
  return /timeout|terminat|Connection|connect/i.test(message);
}
