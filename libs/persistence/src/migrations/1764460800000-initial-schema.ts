import { MigrationInterface, QueryRunner } from 'typeorm';

export class InitialSchema1764460800000 implements MigrationInterface {
  name = 'InitialSchema1764460800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE summaries (
        job_id     uuid PRIMARY KEY,
        tenant     text NOT NULL,
        summary    text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      )`);
    await q.query(`
      CREATE TABLE outbox (
        id              bigserial PRIMARY KEY,
        topic           text NOT NULL,
        dedupe_key      text NOT NULL,
        payload         jsonb NOT NULL,
        attempts        integer NOT NULL DEFAULT 0,
        last_error      text,
        created_at      timestamptz NOT NULL DEFAULT now(),
        sent_at         timestamptz,
        next_attempt_at timestamptz NOT NULL DEFAULT now(),
        lease_until     timestamptz,
        parked_at       timestamptz,
        CONSTRAINT outbox_dedupe_key_unique UNIQUE (dedupe_key)
      )`);
    // The relay's scan: unsent, unparked rows in id order.
    await q.query(`CREATE INDEX outbox_pending_idx ON outbox (id) WHERE sent_at IS NULL AND parked_at IS NULL`);
    // Retention deletes sent rows by age.
    await q.query(`CREATE INDEX outbox_sent_at_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE outbox`);
    await q.query(`DROP TABLE summaries`);
  }
}
