/**
 * The code of a database error: PostgreSQL's SQLSTATE (`23505`), or a socket
 * error's (`ECONNRESET`), whether pg threw it or TypeORM wrapped it
 * (`driverError`); '' when there is none.
 */
export function errorCodeOf(err: unknown): string {
  const e = err as { code?: unknown; driverError?: { code?: unknown } } | null;
  const raw = e?.driverError?.code ?? e?.code;
  return typeof raw === 'string' || typeof raw === 'number' ? String(raw) : '';
}
