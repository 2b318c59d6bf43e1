import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Room for answers that text cannot hold: a text column refuses a NUL and
 * anything that is not UTF-8, so such an answer was never stored and every
 * retry called the provider again. `body_bytes` (a whole answer) and
 * `data_bytes` (a frame) take those bytes; every other answer stays text in
 * `body` and `data`, as before (postgres-idempotency.sql.ts: textBody).
 *
 * Columns added, not `body` retyped to bytea: adding a nullable column
 * rewrites nothing and takes its lock for a moment, where a type change
 * rewrites both tables under an exclusive lock that every claim would wait
 * on; and the previous version, still running while the rollout replaces
 * it, keeps working: its prepared statements and its rows are unchanged, and
 * it reads every answer it could have stored itself. One it could not (kept
 * as bytes only) it would replay with an empty body, until it is replaced.
 */
export class IdempotencyBytes1764892800000 implements MigrationInterface {
  name = 'IdempotencyBytes1764892800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE idempotency_keys ADD COLUMN body_bytes bytea`);
    await q.query(`ALTER TABLE idempotency_frames ADD COLUMN data_bytes bytea`);
  }

  /**
   * The answers stored as bytes are forgotten (their key rows, or their
   * whole frame logs and the records that name them): a retry runs again,
   * as it did before `up`.
   */
  async down(q: QueryRunner): Promise<void> {
    await q.query(`
      WITH logs AS (
        SELECT DISTINCT attempt FROM idempotency_frames WHERE data_bytes IS NOT NULL
      ), frames AS (
        DELETE FROM idempotency_frames f USING logs WHERE f.attempt = logs.attempt
      )
      DELETE FROM idempotency_keys k USING logs WHERE k.attempt = logs.attempt`);
    await q.query(`DELETE FROM idempotency_keys WHERE body_bytes IS NOT NULL`);
    await q.query(`ALTER TABLE idempotency_frames DROP COLUMN data_bytes`);
    await q.query(`ALTER TABLE idempotency_keys DROP COLUMN body_bytes`);
  }
}
