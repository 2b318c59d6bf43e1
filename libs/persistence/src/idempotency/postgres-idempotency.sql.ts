import { bytesOf } from '@app/idempotency';
import { isUtf8 } from 'node:buffer';
import { createHash } from 'node:crypto';

/*
 * A record is a row of idempotency_keys (migration IdempotencyKeys1764633600000):
 *   running:   state=running   token  fingerprint  attempt  started_at  locked_until  [head]  expires_at = locked_until
 *   completed: state=completed status headers body|body_bytes fingerprint [streamed]   expires_at = now() + result TTL
 * An answer's body is stored as text in `body` when text can hold it, and
 * otherwise (a NUL, bytes that are not UTF-8) as bytes in `body_bytes`
 * (migration IdempotencyBytes1764892800000), never both (textBody); a
 * frame's data likewise in `data` or `data_bytes`. Both are read, as they
 * are (bytea would cross pg's text protocol as hex: twice the bytes, and a
 * decode on the event loop), and become the bytes the answer was sent as
 * (text as its UTF-8), the text first: an
 * instance of the previous version that takes a row over and completes it
 * writes only `body`, and bytes left from the row's earlier answer must not
 * win over it. Two columns rather than one retyped to bytea: the migration
 * rewrites no table, and an instance of the previous version, still running
 * during a rollout, reads every answer it could itself have stored.
 * A completed row has no token, so no stale token can match it. Every time is
 * PostgreSQL's (`now()`), so every api instance agrees on how long a request
 * has run and when a lock ends. "Ours" means: our token, running, lock not
 * expired (like the Redis store, whose running record expires with its lock).
 *
 * Each claim names a new attempt (a uuid); its frame log is
 * idempotency_frames(attempt, seq, ...), seq 1, 2, ... from the key row's
 * `next_seq`, taken under the row's lock by every writer, so the seq order is
 * the commit order and a reader that saw seq n has seen everything before it.
 * A log exists only once it is needed (the answer starts streaming, or
 * someone follows): its seq 0 `open` row carries the log's expiry. Entries:
 *   open             the log's lifetime (expires_at); not an event
 *   head  <json>     the answer starts streaming
 *   frame <data>     one frame
 *   end   completed | aborted
 * A follower sets `watched` on the key row (under its lock): however the
 * attempt then ends, release and complete see it and write the end marker.
 * Every write to a log NOTIFYs `idempotency_frames` with the attempt, in the
 * same statement (so at commit).
 */

/** The channel of those NOTIFYs (payload: the attempt); the store LISTENs here. */
export const IDEMPOTENCY_FRAMES_CHANNEL = 'idempotency_frames';

/**
 * How long the row of a running request outlives its lock: a request that
 * died leaves its marker for this long, so the next request with the key
 * knows it takes over (tookOver) and the route's recovery can look up what
 * the dead one did, rather than a swept row making it look new.
 */
const DEAD_RETENTION = '1 day';

/** The lock is ours: $1 key, $2 token. */
const OURS = `key = $1 AND token = $2 AND state = 'running' AND locked_until > now()`;
/**
 * A row a claim with fingerprint `fp` may take over: it expired, or its
 * request died (its lock ended before it completed) while asking the same.
 * A dead request's effect may have happened: a claim with another body is
 * not let in to run something else under its key (and be answered from what
 * the dead one did); it sees the running record and its fingerprint, the 422
 * of any mismatch, until the row expires.
 */
const FREE = (k: string, fp: string) =>
  `((${k}.state = 'running' AND ${k}.locked_until <= now() AND ${k}.fingerprint = ${fp}) OR ${k}.expires_at <= now())`;
/** Every column a claim writes: on a takeover all of them, on a lost race none (each keeps its value). */
const CLAIM_COLUMNS = [
  'fingerprint',
  'state',
  'token',
  'attempt',
  'status',
  'headers',
  'body',
  'body_bytes',
  'streamed',
  'head',
  'watched',
  'next_seq',
  'started_at',
  'locked_until',
  'expires_at',
] as const;

/**
 * Every statement PostgresIdempotencyStore and its frame log run, in one
 * place, with their parameters. Times all come from PostgreSQL's clock
 * (now()), never from the callers' clocks.
 */
export const IdempotencySql = {
  /**
   * The claim, in one statement. `existing` reads the row in the statement's
   * snapshot: a live row (running, or completed and not expired) is the answer
   * as it stands, with no lock and no write, which is what a replay costs. Only
   * when there is no row or a free one is the INSERT tried. Its ON CONFLICT DO
   * UPDATE locks the current version of the row (however new: it may have been
   * committed after our snapshot), and evaluates FREE on that version under
   * the lock: of many concurrent claims exactly one finds it free and writes
   * its attempt; the others keep every column as it is, so RETURNING hands
   * them the winner's row, in the same round trip. (An UPDATE ... WHERE FREE
   * would return nothing to them, and a plain SELECT cannot see a row
   * committed after the statement's snapshot.) The claim won if the row now
   * names our attempt.
   * $1 key, $2 token, $3 fingerprint, $4 lock TTL in ms, $5 the new attempt (a uuid).
   */
  claim: `
WITH existing AS (
  SELECT * FROM idempotency_keys WHERE key = $1
), ins AS (
  INSERT INTO idempotency_keys AS k (key, fingerprint, state, token, attempt, started_at, locked_until, expires_at)
  SELECT $1, $3, 'running', $2, $5::uuid, now(), now() + $4::float8 * interval '1 millisecond', now() + $4::float8 * interval '1 millisecond' + interval '${DEAD_RETENTION}'
  WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE NOT ${FREE('e', '$3')})
  ON CONFLICT (key) DO UPDATE SET
    ${CLAIM_COLUMNS.map((c) => `${c} = CASE WHEN ${FREE('k', 'excluded.fingerprint')} THEN excluded.${c} ELSE k.${c} END`).join(',\n    ')}
  RETURNING k.*
), found AS (
  SELECT * FROM ins
  UNION ALL
  SELECT * FROM existing WHERE NOT EXISTS (SELECT 1 FROM ins)
)
SELECT attempt = $5::uuid AS claimed,
       EXISTS (SELECT 1 FROM existing e WHERE e.state = 'running') AS took_over_running,
       state, fingerprint, attempt, status, headers, body, body_bytes, streamed,
       GREATEST(0, floor(extract(epoch FROM clock_timestamp() - started_at) * 1000))::float8 AS running_for_ms,
       GREATEST(0, floor(extract(epoch FROM locked_until - clock_timestamp()) * 1000))::float8 AS expires_in_ms
FROM found`,

  /** $1 key: the record as a claim would see it, taking nothing; no row when a claim would take the key (FREE). */
  peek: `
SELECT false AS claimed, false AS took_over_running,
       state, fingerprint, attempt, status, headers, body, body_bytes, streamed,
       GREATEST(0, floor(extract(epoch FROM clock_timestamp() - started_at) * 1000))::float8 AS running_for_ms,
       GREATEST(0, floor(extract(epoch FROM locked_until - clock_timestamp()) * 1000))::float8 AS expires_in_ms
FROM idempotency_keys k
WHERE key = $1 AND NOT ((k.state = 'running' AND k.locked_until <= now()) OR k.expires_at <= now())`,

  /**
   * $1 key, $2 token, $3 fingerprint, $4 status, $5 headers (json), $6 body as text or null, $7 result TTL in ms,
   * $8 an ended log's TTL in ms, $9 body as bytes or null (one of $6, $9: textBody).
   */
  complete: `
WITH done AS (
  UPDATE idempotency_keys SET state = 'completed', token = NULL, fingerprint = $3, status = $4, headers = $5::jsonb,
    body = $6::text, body_bytes = $9::bytea, streamed = false, locked_until = NULL, expires_at = now() + $7::float8 * interval '1 millisecond',
    next_seq = next_seq + 1
  WHERE ${OURS}
  RETURNING attempt, next_seq - 1 AS seq, (watched OR head IS NOT NULL) AS followed
), ended AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data)
  SELECT attempt, seq, 'end', 'completed' FROM done WHERE followed
  RETURNING attempt
), aged AS (
  UPDATE idempotency_frames f SET expires_at = now() + $8::float8 * interval '1 millisecond'
  FROM done WHERE f.attempt = done.attempt AND f.seq = 0 AND done.followed
)
SELECT (SELECT pg_notify('${IDEMPOTENCY_FRAMES_CHANNEL}', attempt::text) FROM ended) AS notified FROM done`,

  /** $1 key, $2 token, $3 an ended log's TTL in ms. */
  release: `
WITH freed AS (
  DELETE FROM idempotency_keys WHERE ${OURS}
  RETURNING attempt, next_seq AS seq, (watched OR head IS NOT NULL) AS followed
), ended AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data)
  SELECT attempt, seq, 'end', 'aborted' FROM freed WHERE followed
  RETURNING attempt
), aged AS (
  UPDATE idempotency_frames f SET expires_at = now() + $3::float8 * interval '1 millisecond'
  FROM freed WHERE f.attempt = freed.attempt AND f.seq = 0 AND freed.followed
)
SELECT (SELECT pg_notify('${IDEMPOTENCY_FRAMES_CHANNEL}', attempt::text) FROM ended) AS notified FROM freed`,

  /** The lock ends now; the row stays, so the next claim takes it over knowingly. $1 key, $2 token. */
  abandon: `
UPDATE idempotency_keys SET locked_until = now() WHERE ${OURS} RETURNING 1`,

  /** $1 key, $2 token, $3 lock TTL in ms. */
  renew: `
WITH renewed AS (
  UPDATE idempotency_keys SET locked_until = now() + $3::float8 * interval '1 millisecond', expires_at = now() + $3::float8 * interval '1 millisecond' + interval '${DEAD_RETENTION}'
  WHERE ${OURS}
  RETURNING attempt, locked_until
), frames AS (
  UPDATE idempotency_frames f SET expires_at = renewed.locked_until
  FROM renewed WHERE f.attempt = renewed.attempt AND f.seq = 0
)
SELECT 1 FROM renewed`,

  /** The answer starts streaming: its head, and the log opened. $1 key, $2 token, $3 head (json). */
  begin: `
WITH begun AS (
  UPDATE idempotency_keys SET head = $3::text::jsonb, next_seq = next_seq + 1
  WHERE ${OURS}
  RETURNING attempt, next_seq - 1 AS seq, locked_until
), logged AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
  SELECT attempt, 0, 'open', NULL, locked_until FROM begun
  UNION ALL
  SELECT attempt, seq, 'head', $3::text, NULL FROM begun
  ON CONFLICT (attempt, seq) DO NOTHING
)
SELECT pg_notify('${IDEMPOTENCY_FRAMES_CHANNEL}', attempt::text) FROM begun`,

  /**
   * $1 key, $2 token, $3 the frames as text (text[]), $4 as bytes (bytea[]): the same length, each frame in one of
   * them and null in the other (textBody).
   */
  append: `
WITH taken AS (
  UPDATE idempotency_keys SET next_seq = next_seq + cardinality($3::text[])
  WHERE ${OURS}
  RETURNING attempt, next_seq - cardinality($3::text[]) AS first
), appended AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, data_bytes)
  SELECT taken.attempt, taken.first + f.i - 1, 'frame', f.data, f.bytes
  FROM taken, unnest($3::text[], $4::bytea[]) WITH ORDINALITY AS f(data, bytes, i)
)
SELECT pg_notify('${IDEMPOTENCY_FRAMES_CHANNEL}', attempt::text) FROM taken`,

  /**
   * A streamed answer completes, its last frames appended with the end: the record names its log. $1 key, $2 token,
   * $3 fingerprint, $4 result TTL in ms, $5 and $6 the last frames as `append` takes them (empty arrays for none).
   */
  completeFrames: `
WITH done AS (
  UPDATE idempotency_keys SET state = 'completed', token = NULL, fingerprint = $3,
    status = COALESCE((head->>'status')::integer, 200), headers = COALESCE(head->'headers', '{}'::jsonb), body = '', body_bytes = NULL,
    streamed = true, locked_until = NULL, expires_at = now() + $4::float8 * interval '1 millisecond',
    next_seq = next_seq + cardinality($5::text[]) + 1
  WHERE ${OURS}
  RETURNING attempt, next_seq - cardinality($5::text[]) - 1 AS first, next_seq - 1 AS seq, expires_at
), appended AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, data_bytes)
  SELECT done.attempt, done.first + f.i - 1, 'frame', f.data, f.bytes
  FROM done, unnest($5::text[], $6::bytea[]) WITH ORDINALITY AS f(data, bytes, i)
), logged AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
  SELECT attempt, 0, 'open', NULL, expires_at FROM done
  UNION ALL
  SELECT attempt, seq, 'end', 'completed', NULL FROM done
  ON CONFLICT (attempt, seq) DO UPDATE SET expires_at = excluded.expires_at
)
SELECT pg_notify('${IDEMPOTENCY_FRAMES_CHANNEL}', attempt::text) FROM done`,

  /**
   * A follower registers (sets `watched` under the row's lock, and opens the
   * log) while the attempt runs: from then on its end is written to the log,
   * however it ends. No row back: the attempt ended (or died) before.
   * $1 key, $2 attempt.
   */
  watch: `
WITH watched AS (
  UPDATE idempotency_keys SET watched = true
  WHERE key = $1 AND attempt = $2::uuid AND state = 'running' AND locked_until > now()
  RETURNING attempt, locked_until
), opened AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
  SELECT attempt, 0, 'open', NULL, locked_until FROM watched
  ON CONFLICT (attempt, seq) DO NOTHING
)
SELECT 1 FROM watched`,

  /** A row back while the attempt holds its lock. $1 key, $2 attempt. */
  alive: `SELECT 1 FROM idempotency_keys WHERE key = $1 AND attempt = $2::uuid AND state = 'running' AND locked_until > now()`,

  /**
   * One page of a log, in seq order. Text and bytes as separate columns: text crosses the wire as itself, where
   * bytea would cross as hex (twice the bytes, and a decode in the process). $1 attempt, $2 the last seq read,
   * $3 page size.
   */
  read: `SELECT seq, kind, data, data_bytes FROM idempotency_frames WHERE attempt = $1::uuid AND seq > $2 ORDER BY seq LIMIT $3`,

  /**
   * The sweep, in batches: a few hundred rows per statement, each picked by its
   * index and locked with SKIP LOCKED, so sweeps on several instances take
   * different rows and none waits on a claim. A log goes whole (its open row
   * picks it), as it expires with its record or a minute after it ended.
   * $1 batch.
   */
  sweepKeys: `
DELETE FROM idempotency_keys WHERE ctid IN (
  SELECT ctid FROM idempotency_keys WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= now()`,

  /** $1 batch. */
  sweepFrames: `
WITH expired AS (
  SELECT attempt FROM idempotency_frames WHERE seq = 0 AND expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), logs AS (
  DELETE FROM idempotency_frames f USING expired WHERE f.attempt = expired.attempt
  RETURNING f.seq
)
SELECT count(*) FILTER (WHERE seq = 0)::integer AS logs, count(*)::integer AS rows FROM logs`,
} as const;

/**
 * How bytes are stored: as text when text can hold them (UTF-8 without a
 * NUL), which is every answer an earlier version could store, so it reads
 * them too; otherwise as bytes. Exactly one of the two is set.
 */
export function textBody(value: Uint8Array | string): { text: string | null; bytes: Buffer | null } {
  // A string, from a store implementer's caller that still passes text, is its UTF-8.
  const bytes = bytesOf(value);
  return isUtf8(bytes) && !bytes.includes(0) ? { text: bytes.toString('utf8'), bytes: null } : { text: null, bytes };
}

const statementNames = new Map<string, string>();

/** A prepared statement's name, from its text: one text, one name, on every connection. */
export function statementName(sql: string): string {
  let name = statementNames.get(sql);
  if (name === undefined) {
    name = `idempotency_${createHash('sha256').update(sql).digest('hex').slice(0, 16)}`;
    statementNames.set(sql, name);
  }
  return name;
}
