import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Payouts sent to the provider whose refund is not recorded yet: a row is
 * committed before each payout request leaves, and deleted in the
 * transaction that records the refund. A row means "a payout with this
 * reference may exist": the next request for the refund looks it up first,
 * whenever it comes (the key's record may be long gone), and no second
 * payout is sent while an earlier one can still be in flight
 * (`last_sent_at`). A refusal of the last send deletes it with the stored
 * refusal (RefundRepository.settleRefused).
 */
export class RefundAttempts1764806400000 implements MigrationInterface {
  name = 'RefundAttempts1764806400000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE refund_attempts (
        refund_id     uuid PRIMARY KEY,
        tenant        text NOT NULL,
        ticket_id     text NOT NULL,
        order_id      text NOT NULL,
        amount        integer NOT NULL,
        currency      text NOT NULL,
        sends         integer NOT NULL DEFAULT 1,
        first_sent_at timestamptz NOT NULL DEFAULT now(),
        last_sent_at  timestamptz NOT NULL DEFAULT now()
      )`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE refund_attempts`);
  }
}
