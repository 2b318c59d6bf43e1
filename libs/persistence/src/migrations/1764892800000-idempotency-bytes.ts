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
 * it reads every answer it could have stored itself.
 *
 * The rollout's window: an answer the new version stored as bytes only
 * (`body_bytes`: a NUL, or bytes that are not UTF-8) is replayed by a pod of
 * the previous version, which knows only `body`, with its stored status and
 * headers and an EMPTY body (for most, an empty 200); a streamed answer's
 * frames kept in `data_bytes` drop out of its replay. Those answers could not
 * be stored at all before (each retry ran again). The window closes when the
 * rollout finishes; to have none, scale the previous version to zero before
 * traffic that can produce such answers reaches the new one. docs/operations.md
 * (Upgrading) says the same for operators.
 */
export class IdempotencyBytes1764892800000 implements MigrationInterface {
  name = 'IdempotencyBytes1764892800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE idempotency_keys ADD COLUMN body_bytes bytea`);
    await q.query(`ALTER TABLE idempotency_frames ADD COLUMN data_bytes bytea`);
  }

  /**
   * The answers stored as bytes are forgotten (their key rows, or their
   * whole frame logs and the completed records that name them): a retry runs
   * again, as it did before `up`. Only a completed record whose answer is in
   * the bytes alone: a row the previous version took over (its statements
   * know no `body_bytes`, so the bytes of the answer before stay beside it)
   * is running, a live lock, or completed with its own text, and it stays.
   */
  async down(q: QueryRunner): Promise<void> {
    await q.query(`
      WITH logs AS (
        SELECT DISTINCT attempt FROM idempotency_frames WHERE data_bytes IS NOT NULL
      ), frames AS (
        DELETE FROM idempotency_frames f USING logs WHERE f.attempt = logs.attempt
      )
      DELETE FROM idempotency_keys k USING logs
      WHERE k.attempt = logs.attempt AND k.state = 'completed' AND k.streamed`);
    await q.query(`DELETE FROM idempotency_keys WHERE state = 'completed' AND body IS NULL AND body_bytes IS NOT NULL`);
    await q.query(`ALTER TABLE idempotency_frames DROP COLUMN data_bytes`);
    await q.query(`ALTER TABLE idempotency_keys DROP COLUMN body_bytes`);
  }
}
