import { errorCodeOf } from '@app/persistence';

/**
 * The schema a migration has not created yet: while the migration Job of a
 * rollout still runs, new workers may already take jobs. Worth a redelivery;
 * MAX_DELIVERIES still bounds a migration that never comes.
 * 42P01 undefined_table, 42703 undefined_column, 42883 undefined_function,
 * 42704 undefined_object (a type, an index), 3F000 invalid_schema_name.
 */
const SCHEMA_NOT_READY = new Set(['42P01', '42703', '42883', '42704', '3F000']);

/** Socket errors of a connection to PostgreSQL (Node's codes). */
const SOCKET_ERRORS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/** A five-character SQLSTATE, not a Node error code. */
const SQLSTATE = /^[0-9A-Z]{5}$/;

/** An error from PostgreSQL or its driver: TypeORM's QueryFailedError (driverError), or pg's own DatabaseError. */
function isDriverError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  if ('driverError' in err || err.name === 'QueryFailedError') return true;
  return err.name === 'DatabaseError' && typeof (err as { severity?: unknown }).severity === 'string';
}

/**
 * PostgreSQL unreachable (a socket error, SQLSTATE class 08, the driver's
 * lost connection): a batch that failed so would fail the same way item by
 * item.
 */
export function isConnectionError(err: unknown): boolean {
  const code = errorCodeOf(err);
  if (SOCKET_ERRORS.has(code)) return true;
  if (SQLSTATE.test(code)) return code.startsWith('08') || code.startsWith('57P');
  const driver = (err as { driverError?: unknown } | null)?.driverError ?? err;
  const message = driver instanceof Error ? driver.message : '';
  return /Connection terminated|connection timeout|timeout exceeded when trying to connect/i.test(message);
}

/**
 * PostgreSQL being unreachable or busy, or its schema not migrated yet: worth
 * a redelivery. SQLSTATE classes 08 (connection), 53 (resources), 57
 * (operator intervention), 40001/40P01, 55P03 (lock not available), a schema
 * not migrated yet, and a lost connection. `fromStep`: the error came out of
 * a step's own code, where only a SQLSTATE or an error of PostgreSQL's driver
 * counts (a step's own ENOENT, ECONNREFUSED from another service, or a message
 * that happens to say "connect" is not a database error); the engine's own
 * statements count a bare socket error too.
 */
export function isTransientDatabaseError(err: unknown, fromStep = false): boolean {
  const code = errorCodeOf(err);
  if (SOCKET_ERRORS.has(code)) return !fromStep || isDriverError(err);
  if (SQLSTATE.test(code))
    return /^(08|53|57)/.test(code) || ['40001', '40P01', '55P03'].includes(code) || SCHEMA_NOT_READY.has(code);
  return isDriverError(err) && isConnectionError(err);
}

/**
 * An error a statement gets however often it runs (SQLSTATE classes 22 data,
 * 23 constraint, 42 syntax or access), the schema not migrated yet excepted:
 * a commit that failed so, alone, will fail again.
 */
export function isDeterministicDatabaseError(err: unknown): boolean {
  const code = errorCodeOf(err);
  return /^(22|23|42)/.test(code) && !SCHEMA_NOT_READY.has(code);
}
