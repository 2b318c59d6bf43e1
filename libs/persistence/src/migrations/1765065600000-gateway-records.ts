import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The gateway's own records beside the idempotency records
 * (IDEMPOTENCY_STORE=postgres; the Redis store keeps them as keys), each kept
 * as long as a record would be; expired rows are deleted a batch at a time as
 * new ones are written.
 *
 * `gateway_upstream_pins`: which upstream an operation's call went to while
 * its outcome is unknown. A retry of that operation goes to the same upstream
 * with the same upstream key, never falls back to another (which could make
 * a second completion). A pin outlives the idempotency record it belongs to
 * (a failed call frees the record).
 *
 * `gateway_responses`: each response the Responses API made through the
 * gateway: the tenant that created it (GET, cancel, DELETE and
 * `previous_response_id` are that tenant's alone: tenants share the provider
 * account), the upstream that served it (they go there), and, for a keyed
 * call, the operation whose record holds its answer (GET and resumed streams
 * read it).
 */
export class GatewayRecords1765065600000 implements MigrationInterface {
  name = 'GatewayRecords1765065600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`
      CREATE TABLE gateway_upstream_pins (
        operation  text PRIMARY KEY,
        upstream   text NOT NULL,
        expires_at timestamptz NOT NULL
      )`);
    await q.query(`CREATE INDEX gateway_upstream_pins_expires_at ON gateway_upstream_pins (expires_at)`);
    await q.query(`
      CREATE TABLE gateway_responses (
        response_id text PRIMARY KEY,
        tenant      text NOT NULL,
        upstream    text NOT NULL,
        operation   text,
        expires_at  timestamptz NOT NULL
      )`);
    await q.query(`CREATE INDEX gateway_responses_expires_at ON gateway_responses (expires_at)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE gateway_responses`);
    await q.query(`DROP TABLE gateway_upstream_pins`);
  }
}
