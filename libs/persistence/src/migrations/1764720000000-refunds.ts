import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The refunds route's paid refunds, one row per refund id (a UUIDv5 of the
 * tenant and the request's Idempotency-Key, and the payout's reference at the
 * provider). A row is written in the same transaction that stores the
 * request's answer in `idempotency_keys`: a refund is recorded with its answer
 * or not at all. Refusals and unknown outcomes have no row.
 */
export class Refunds1764720000000 implements MigrationInterface {
  name = 'Refunds1764720000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE refunds (
        refund_id  uuid PRIMARY KEY,
        tenant     text NOT NULL,
        ticket_id  text NOT NULL CHECK (length(ticket_id) BETWEEN 1 AND 64),
        order_id   text NOT NULL CHECK (length(order_id) BETWEEN 1 AND 64),
        amount     integer NOT NULL CHECK (amount BETWEEN 1 AND 1000000000),
        currency   text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
        payout_id  text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      )`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE refunds`);
  }
}
