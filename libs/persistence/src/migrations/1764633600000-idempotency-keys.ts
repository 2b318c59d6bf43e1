import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * PostgresIdempotencyStore's tables. A key's row is its record; an attempt's
 * frame log (a streamed answer, written as it is produced) lives in
 * `idempotency_frames` under the attempt's id, so a freed attempt's frames
 * never mix with the next one's. Seq 0 of a log is its `open` row, the only
 * one with `expires_at`: the log's lifetime (the lock while running, the
 * result TTL once completed, a minute once it ended otherwise), which is
 * what the sweep reads.
 */
export class IdempotencyKeys1764633600000 implements MigrationInterface {
  name = 'IdempotencyKeys1764633600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE idempotency_keys (
        key          text PRIMARY KEY,
        fingerprint  text NOT NULL,
        state        text NOT NULL CHECK (state IN ('running', 'completed')),
        token        text,
        attempt      uuid NOT NULL,
        status       integer,
        headers      jsonb,
        body         text,
        streamed     boolean NOT NULL DEFAULT false,
        head         jsonb,
        watched      boolean NOT NULL DEFAULT false,
        next_seq     integer NOT NULL DEFAULT 1,
        started_at   timestamptz NOT NULL,
        locked_until timestamptz,
        expires_at   timestamptz NOT NULL,
        CONSTRAINT idempotency_keys_running_has_lock CHECK ((state = 'running') = (token IS NOT NULL AND locked_until IS NOT NULL))
      )`);
    // The sweep deletes expired rows in small batches.
    await q.query(`CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)`);
    await q.query(`
      CREATE TABLE idempotency_frames (
        attempt    uuid NOT NULL,
        seq        integer NOT NULL,
        kind       text NOT NULL CHECK (kind IN ('open', 'head', 'frame', 'end')),
        data       text,
        expires_at timestamptz,
        PRIMARY KEY (attempt, seq),
        CONSTRAINT idempotency_frames_open_expires CHECK ((seq = 0) = (expires_at IS NOT NULL))
      )`);
    await q.query(`CREATE INDEX idempotency_frames_expires_at_idx ON idempotency_frames (expires_at) WHERE seq = 0`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE idempotency_frames`);
    await q.query(`DROP TABLE idempotency_keys`);
  }
}
