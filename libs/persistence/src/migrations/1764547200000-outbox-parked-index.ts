import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Parked rows are counted on every metrics scrape and listed by operators;
 * without an index both scan the whole table, sent history included.
 */
export class OutboxParkedIndex1764547200000 implements MigrationInterface {
  name = 'OutboxParkedIndex1764547200000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE INDEX outbox_parked_idx ON outbox (id) WHERE parked_at IS NOT NULL AND sent_at IS NULL`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP INDEX outbox_parked_idx`);
  }
}
