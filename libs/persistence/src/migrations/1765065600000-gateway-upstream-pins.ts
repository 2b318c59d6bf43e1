import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The gateway's upstream pins (IDEMPOTENCY_STORE=postgres; the Redis store
 * keeps them as keys): which upstream an operation's call went to while its
 * outcome is unknown. A retry of that operation goes to the same upstream
 * with the same upstream key, never falls back to another (which could make
 * a second completion). A pin outlives the idempotency record it belongs to
 * (a failed call frees the record), for as long as a record would be kept;
 * expired rows are deleted a batch at a time as new pins are written.
 */
export class GatewayUpstreamPins1765065600000 implements MigrationInterface {
  name = 'GatewayUpstreamPins1765065600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE gateway_upstream_pins (
        operation  text PRIMARY KEY,
        upstream   text NOT NULL,
        expires_at timestamptz NOT NULL
      )`);
    await q.query(`CREATE INDEX gateway_upstream_pins_expires_at ON gateway_upstream_pins (expires_at)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE gateway_upstream_pins`);
  }
}
