/**
 * The PostgreSQL store's tables as the monorepo's migrations leave them
 * (IdempotencyKeys1764633600000 and IdempotencyBytes1764892800000 in
 * libs/persistence), as one script for an app that has its own migrations:
 * it creates what is missing (IF NOT EXISTS), e.g. `await pool.query(IDEMPOTENCY_SCHEMA_SQL)` at start-up. The packages
 * test runs it on an empty database and drives the store over it.
 */
export const IDEMPOTENCY_SCHEMA_SQL = `
CREATE TABLE IF NOT EXISTS idempotency_keys (
  key          text PRIMARY KEY,
  fingerprint  text NOT NULL,
  state        text NOT NULL CHECK (state IN ('running', 'completed')),
  token        text,
  attempt      uuid NOT NULL,
  status       integer,
  headers      jsonb,
  body         text,
  body_bytes   bytea,
  streamed     boolean NOT NULL DEFAULT false,
  head         jsonb,
  watched      boolean NOT NULL DEFAULT false,
  next_seq     integer NOT NULL DEFAULT 1,
  started_at   timestamptz NOT NULL,
  locked_until timestamptz,
  expires_at   timestamptz NOT NULL,
  CONSTRAINT idempotency_keys_running_has_lock CHECK ((state = 'running') = (token IS NOT NULL AND locked_until IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_frames (
  attempt    uuid NOT NULL,
  seq        integer NOT NULL,
  kind       text NOT NULL CHECK (kind IN ('open', 'head', 'frame', 'end')),
  data       text,
  data_bytes bytea,
  expires_at timestamptz,
  PRIMARY KEY (attempt, seq),
  CONSTRAINT idempotency_frames_open_expires CHECK ((seq = 0) = (expires_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS idempotency_frames_expires_at_idx ON idempotency_frames (expires_at) WHERE seq = 0;
`;
