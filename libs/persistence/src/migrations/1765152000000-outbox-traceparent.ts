import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * `outbox.traceparent`: the W3C trace context of the step that wrote the row
 * (docs/operations.md, Traces), so the relay's send, and the webhook's
 * `traceparent` header, continue the request's trace. NULL when tracing is off.
 * Adding a nullable column without a default rewrites nothing.
 */
export class OutboxTraceparent1765152000000 implements MigrationInterface {
  name = 'OutboxTraceparent1765152000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE outbox ADD COLUMN traceparent text`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE outbox DROP COLUMN traceparent`);
  }
}
