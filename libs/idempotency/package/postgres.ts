/*
 * @llm-workflows/nestjs-idempotency/postgres: the PostgreSQL store on a pg
 * Pool (pg is an optional peer: only this entry point loads it), and the
 * tables it needs.
 */
export {
  type DataSourceLike,
  PostgresIdempotencyStore,
  type PostgresIdempotencyStoreOptions,
  type SweepResult,
  type SweepRun,
} from '../../persistence/src/idempotency/postgres-idempotency.store';
export { IDEMPOTENCY_SCHEMA_SQL } from './postgres-schema';
