import { OUTBOX_CHANNEL } from '../outbox-channel';

/**
 * Every statement that reads or writes the outbox table, in one place: the
 * writers' insert (with its wake-up), the relay's claim and outcomes, and the
 * admin's parked rows and figures. Times all come from PostgreSQL's clock
 * (now()), never from the callers' clocks.
 */
export const OutboxSql = {
  /**
   * Effects and their outbox rows in one statement (so one transaction), for
   * any number at once. `rows` is a SELECT named `input` here, one row per
   * effect, with the columns `topic`, `dedupe_key`, `payload` (jsonb) and the
   * effect's `key`; `effect` an `INSERT ... SELECT ... FROM input ... RETURNING
   * <key>` (typically `ON CONFLICT DO NOTHING`). An outbox row is written for
   * each input row whose key the effect returned, and the relays are woken
   * (`pg_notify`, delivered at commit). Returns the `dedupe_key` of each
   * outbox row written. `rows` must hold each key once (the join is on it):
   * two input rows of one key would both get an outbox row.
   */
  insertAfterEach: (rows: string, effect: string, key: string): string =>
    `WITH input AS (
       ${rows}
     ), effect AS (
       ${effect}
     ), message AS (
       INSERT INTO outbox (topic, dedupe_key, payload)
       SELECT input.topic, input.dedupe_key, input.payload FROM input JOIN effect USING (${key})
       RETURNING id, dedupe_key
     )
     SELECT dedupe_key, pg_notify('${OUTBOX_CHANNEL}', id::text) FROM message`,

  /**
   * $1 batch, $2 lease length in ms, $3 max attempts. `withTraceparent` (the
   * relay traces) returns each row's `traceparent` too; untraced, the claim
   * does not name the column, so a relay runs against a database not migrated
   * to it yet (docs/operations.md, Upgrading).
   */
  claim: (withTraceparent: boolean): string => `WITH due AS MATERIALIZED (
         SELECT id FROM outbox
          WHERE sent_at IS NULL
            AND parked_at IS NULL
            AND attempts < $3
            AND next_attempt_at <= now()
            AND (lease_until IS NULL OR lease_until < now())
          ORDER BY id
          LIMIT $1
          FOR UPDATE SKIP LOCKED
       )
       UPDATE outbox o
          SET lease_until = date_trunc('milliseconds', now()) + $2::integer * interval '1 millisecond'
         FROM due
        WHERE o.id = due.id
       RETURNING o.id, o.topic, o.dedupe_key, o.payload, o.attempts, o.lease_until${withTraceparent ? ', o.traceparent' : ''}`,

  /**
   * $1 ids, $2 their leases (arrays, one element per row): the rows sent
   * together, recorded in one statement. Returns the ids recorded (a row
   * whose lease is no longer that one is not).
   */
  markSent: `UPDATE outbox o
            SET sent_at = now(), lease_until = NULL
           FROM unnest($1::bigint[], $2::timestamptz[]) AS s(id, lease)
          WHERE o.id = s.id AND o.lease_until = s.lease AND o.sent_at IS NULL
         RETURNING o.id`,

  /** $1 id, $2 lease, $3 error, $4 delay in ms. */
  markFailed: `UPDATE outbox
            SET attempts = attempts + 1,
                last_error = $3,
                next_attempt_at = now() + $4::integer * interval '1 millisecond',
                lease_until = NULL
          WHERE id = $1 AND lease_until = $2 AND sent_at IS NULL
         RETURNING id`,

  /** $1 id, $2 lease, $3 error. */
  park: `UPDATE outbox
            SET attempts = attempts + 1,
                last_error = $3,
                parked_at = now(),
                lease_until = NULL
          WHERE id = $1 AND lease_until = $2 AND sent_at IS NULL
         RETURNING id`,

  /** $1 max attempts. */
  parkExhausted: `UPDATE outbox
          SET parked_at = now()
        WHERE sent_at IS NULL AND parked_at IS NULL AND attempts >= $1
          AND (lease_until IS NULL OR lease_until < now())
       RETURNING id`,

  /** $1 retention in days, $2 limit. */
  deleteSentBefore: `DELETE FROM outbox
        WHERE id IN (
          SELECT id FROM outbox
           WHERE sent_at < now() - $1::integer * interval '1 day'
           LIMIT $2
           FOR UPDATE SKIP LOCKED
        )
       RETURNING id`,

  /** $1 limit. */
  listParked: `SELECT id, topic, dedupe_key, attempts, last_error, created_at, parked_at
         FROM outbox
        WHERE parked_at IS NOT NULL AND sent_at IS NULL
        ORDER BY id
        LIMIT $1`,

  /** $1 id, or NULL for every parked row. */
  requeueParked: `WITH requeued AS (
         UPDATE outbox
            SET parked_at = NULL, attempts = 0, last_error = NULL, lease_until = NULL, next_attempt_at = now()
          WHERE parked_at IS NOT NULL AND sent_at IS NULL AND ($1::bigint IS NULL OR id = $1::bigint)
          RETURNING id
       )
       SELECT id, pg_notify('${OUTBOX_CHANNEL}', id::text) FROM requeued`,

  /**
   * Each part matches the predicate of a partial index (outbox_pending_idx,
   * outbox_parked_idx) so only unsent rows are read: one pass over the table
   * with FILTERs would read the sent history too.
   */
  figures: `SELECT pending.backlog, parked.parked, extract(epoch FROM now() - pending.oldest)::float8 AS oldest
         FROM (SELECT count(*) AS backlog, min(created_at) AS oldest
                 FROM outbox WHERE sent_at IS NULL AND parked_at IS NULL) AS pending,
              (SELECT count(*) AS parked
                 FROM outbox WHERE parked_at IS NOT NULL AND sent_at IS NULL) AS parked`,
} as const;

/** An outbox row as a writer asks for it; the relay delivers `payload` under `dedupeKey`. */
export interface NewOutboxMessage {
  readonly topic: string;
  readonly dedupeKey: string;
  readonly payload: Readonly<Record<string, unknown>>;
  /** The W3C trace the row continues, its writer's (libs/tracing); the relay's send is its child. */
  readonly traceparent?: string;
}
