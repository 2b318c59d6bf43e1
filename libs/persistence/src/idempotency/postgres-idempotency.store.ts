import { Logger } from '@nestjs/common';
import type {
  ClaimResult,
  FrameEvent,
  FramesRef,
  IdempotencyFrameLog,
  IdempotencyStore,
  StoredHead,
  StoredResponse,
} from '@app/idempotency';
import { createHash, randomUUID } from 'node:crypto';
import type { ClientConfig, Pool, QueryResultRow } from 'pg';
import { DataSource } from 'typeorm';
import { PgNotificationListener, type Subscription } from './pg-notification-listener';

/*
 * A record is a row of idempotency_keys (migration IdempotencyKeys1764633600000):
 *   running:   state=running   token  fingerprint  attempt  started_at  locked_until  [head]   expires_at = locked_until
 *   completed: state=completed status headers body fingerprint [streamed]               expires_at = now() + result TTL
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
const CHANNEL = 'idempotency_frames';
const PAGE = 256;
/** How long an ended log that no completed record names (a freed attempt) stays, for its followers to read the end. */
const ENDED_FRAMES_TTL_MS = 60_000;
const DEFAULT_SWEEP_BATCH = 500;
const DEFAULT_SWEEP_INTERVAL_MS = 60_000;
/** The most batches one periodic sweep deletes; the rest waits for the next. */
const MAX_BATCHES_PER_SWEEP = 20;

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
  'streamed',
  'head',
  'watched',
  'next_seq',
  'started_at',
  'locked_until',
  'expires_at',
] as const;

/*
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
 */
const CLAIM_SQL = `
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
       state, fingerprint, attempt, status, headers, body, streamed,
       GREATEST(0, floor(extract(epoch FROM clock_timestamp() - started_at) * 1000))::float8 AS running_for_ms,
       GREATEST(0, floor(extract(epoch FROM locked_until - clock_timestamp()) * 1000))::float8 AS expires_in_ms
FROM found`;

const COMPLETE_SQL = `
WITH done AS (
  UPDATE idempotency_keys SET state = 'completed', token = NULL, fingerprint = $3, status = $4, headers = $5::jsonb,
    body = $6, streamed = false, locked_until = NULL, expires_at = now() + $7::float8 * interval '1 millisecond',
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
SELECT (SELECT pg_notify('${CHANNEL}', attempt::text) FROM ended) AS notified FROM done`;

const RELEASE_SQL = `
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
SELECT (SELECT pg_notify('${CHANNEL}', attempt::text) FROM ended) AS notified FROM freed`;

/** The lock ends now; the row stays, so the next claim takes it over knowingly. */
const ABANDON_SQL = `
UPDATE idempotency_keys SET locked_until = now() WHERE ${OURS} RETURNING 1`;

const RENEW_SQL = `
WITH renewed AS (
  UPDATE idempotency_keys SET locked_until = now() + $3::float8 * interval '1 millisecond', expires_at = now() + $3::float8 * interval '1 millisecond' + interval '${DEAD_RETENTION}'
  WHERE ${OURS}
  RETURNING attempt, locked_until
), frames AS (
  UPDATE idempotency_frames f SET expires_at = renewed.locked_until
  FROM renewed WHERE f.attempt = renewed.attempt AND f.seq = 0
)
SELECT 1 FROM renewed`;

const BEGIN_SQL = `
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
SELECT pg_notify('${CHANNEL}', attempt::text) FROM begun`;

const APPEND_SQL = `
WITH taken AS (
  UPDATE idempotency_keys SET next_seq = next_seq + cardinality($3::text[])
  WHERE ${OURS}
  RETURNING attempt, next_seq - cardinality($3::text[]) AS first
), appended AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data)
  SELECT taken.attempt, taken.first + f.i - 1, 'frame', f.data
  FROM taken, unnest($3::text[]) WITH ORDINALITY AS f(data, i)
)
SELECT pg_notify('${CHANNEL}', attempt::text) FROM taken`;

const COMPLETE_FRAMES_SQL = `
WITH done AS (
  UPDATE idempotency_keys SET state = 'completed', token = NULL, fingerprint = $3,
    status = COALESCE((head->>'status')::integer, 200), headers = COALESCE(head->'headers', '{}'::jsonb), body = '',
    streamed = true, locked_until = NULL, expires_at = now() + $4::float8 * interval '1 millisecond', next_seq = next_seq + 1
  WHERE ${OURS}
  RETURNING attempt, next_seq - 1 AS seq, expires_at
), logged AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
  SELECT attempt, 0, 'open', NULL, expires_at FROM done
  UNION ALL
  SELECT attempt, seq, 'end', 'completed', NULL FROM done
  ON CONFLICT (attempt, seq) DO UPDATE SET expires_at = excluded.expires_at
)
SELECT pg_notify('${CHANNEL}', attempt::text) FROM done`;

/**
 * A follower registers (sets `watched` under the row's lock, and opens the
 * log) while the attempt runs: from then on its end is written to the log,
 * however it ends. No row back: the attempt ended (or died) before.
 */
const WATCH_SQL = `
WITH watched AS (
  UPDATE idempotency_keys SET watched = true
  WHERE key = $1 AND attempt = $2::uuid AND state = 'running' AND locked_until > now()
  RETURNING attempt, locked_until
), opened AS (
  INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
  SELECT attempt, 0, 'open', NULL, locked_until FROM watched
  ON CONFLICT (attempt, seq) DO NOTHING
)
SELECT 1 FROM watched`;

const ALIVE_SQL = `SELECT 1 FROM idempotency_keys WHERE key = $1 AND attempt = $2::uuid AND state = 'running' AND locked_until > now()`;

const READ_SQL = `SELECT seq, kind, data FROM idempotency_frames WHERE attempt = $1::uuid AND seq > $2 ORDER BY seq LIMIT $3`;

/*
 * The sweep, in batches: a few hundred rows per statement, each picked by its
 * index and locked with SKIP LOCKED, so sweeps on several instances take
 * different rows and none waits on a claim. A log goes whole (its open row
 * picks it), as it expires with its record or a minute after it ended.
 */
const SWEEP_KEYS_SQL = `
DELETE FROM idempotency_keys WHERE ctid IN (
  SELECT ctid FROM idempotency_keys WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= now()`;

const SWEEP_FRAMES_SQL = `
WITH expired AS (
  SELECT attempt FROM idempotency_frames WHERE seq = 0 AND expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), logs AS (
  DELETE FROM idempotency_frames f USING expired WHERE f.attempt = expired.attempt
  RETURNING f.seq
)
SELECT count(*) FILTER (WHERE seq = 0)::integer AS logs, count(*)::integer AS rows FROM logs`;

export interface PostgresIdempotencyStoreOptions {
  /** How long a follower waits for news before it checks that the request is still alive. Default 1000. */
  readonly idleCheckMs?: number;
  /** Rows per sweep statement. Default 500. */
  readonly sweepBatch?: number;
  /** How often `startSweeping()` sweeps. Default a minute. */
  readonly sweepIntervalMs?: number;
  /** Shown in pg_stat_activity for the LISTEN connection. Default `idempotency-listen`. */
  readonly listenApplicationName?: string;
}

export interface SweepResult {
  /** Key rows deleted. */
  readonly keys: number;
  /** Frame logs deleted (whole). */
  readonly frameLogs: number;
}

interface ClaimRow {
  claimed: boolean;
  /** With `claimed`: the row it took was a running request's whose lock had expired. */
  took_over_running?: boolean;
  state: 'running' | 'completed';
  fingerprint: string;
  attempt: string;
  status: number | null;
  headers: Record<string, string> | null;
  body: string | null;
  streamed: boolean;
  running_for_ms: number;
  expires_in_ms: number;
}

/** What a claim found, as the contract says it (pure: the row is the only fact). */
export function claimResultOf(row: ClaimRow, key: string): ClaimResult {
  if (row.claimed) return row.took_over_running ? { outcome: 'claimed', tookOver: true } : { outcome: 'claimed' };
  if (row.state === 'completed') {
    return {
      outcome: 'completed',
      fingerprint: row.fingerprint,
      response: {
        status: Number(row.status),
        headers: row.headers ?? {},
        body: row.body ?? '',
        ...(row.streamed ? { frames: framesRef(row.attempt, key) } : {}),
      },
    };
  }
  return {
    outcome: 'in-progress',
    fingerprint: row.fingerprint,
    runningForMs: row.running_for_ms,
    expiresInMs: row.expires_in_ms,
    frames: framesRef(row.attempt, key),
  };
}

/** COMPLETE_SQL's parameters, alike on the store's pool and in a caller's transaction. */
function completeParams(
  key: string,
  token: string,
  fingerprint: string,
  response: StoredResponse,
  resultTtlMs: number,
): unknown[] {
  return [
    key,
    token,
    fingerprint,
    response.status,
    JSON.stringify(response.headers),
    response.body,
    resultTtlMs,
    ENDED_FRAMES_TTL_MS,
  ];
}

/** A frames ref names the attempt and its key (so the liveness check reads the key row by its primary key). */
function framesRef(attempt: string, key: string): FramesRef {
  return `${attempt}:${key}` as FramesRef;
}

function parseRef(ref: FramesRef): { attempt: string; key: string } {
  const attempt = ref.slice(0, 36);
  if (ref[36] !== ':' || !/^[0-9a-f-]{36}$/.test(attempt)) throw new Error('not a frames reference of this store');
  return { attempt, key: ref.slice(37) };
}

type Db = Pool | DataSource;

/**
 * IdempotencyStore in PostgreSQL: one row per key, claimed in one statement,
 * every change conditional on the holder's token; streamed answers as frame
 * logs that followers read in pages and wait on through one LISTEN
 * connection per store. Built on a pg Pool or on a TypeORM DataSource (its
 * pool: the queries are SQL as written, not entity calls). Call
 * `startSweeping()` to delete expired rows periodically; `close()` ends the
 * LISTEN connection and the sweep, not the pool.
 */
export class PostgresIdempotencyStore implements IdempotencyStore {
  private readonly logger = new Logger(PostgresIdempotencyStore.name);
  private readonly sweepBatch: number;
  private readonly sweepIntervalMs: number;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;
  private readonly listener: PgNotificationListener;
  readonly frames: PostgresFrameLog;

  constructor(
    private readonly db: Db,
    options: PostgresIdempotencyStoreOptions = {},
  ) {
    this.sweepBatch = options.sweepBatch ?? DEFAULT_SWEEP_BATCH;
    this.sweepIntervalMs = options.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS;
    const applicationName = options.listenApplicationName ?? 'idempotency-listen';
    this.listener = new PgNotificationListener(CHANNEL, () => listenConfig(this.pool(), applicationName));
    this.frames = new PostgresFrameLog(
      (sql, params) => this.query(sql, params),
      this.listener,
      options.idleCheckMs ?? 1000,
    );
  }

  async claim(key: string, token: string, fingerprint: string, lockTtlMs: number): Promise<ClaimResult> {
    const rows = await this.query<ClaimRow>(CLAIM_SQL, [key, token, fingerprint, lockTtlMs, randomUUID()]);
    if (rows.length !== 1) throw new Error(`idempotency claim returned ${rows.length} rows`);
    return claimResultOf(rows[0], key);
  }

  async complete(
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean> {
    return (
      (await this.query(COMPLETE_SQL, completeParams(key, token, fingerprint, response, resultTtlMs))).length === 1
    );
  }

  /**
   * complete(), as part of the caller's transaction: `tx` is a TypeORM
   * EntityManager or QueryRunner (anything with `query(sql, params)`) of an
   * open transaction on this database. The answer is stored if, and only
   * if, that transaction commits, together with the effect's rows.
   */
  async completeWithin(
    tx: unknown,
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean> {
    const runner = tx as {
      query?: (sql: string, params: unknown[]) => Promise<unknown>;
      isTransactionActive?: boolean;
      queryRunner?: { isTransactionActive?: boolean };
    };
    // An EntityManager of dataSource.transaction() carries its QueryRunner; a QueryRunner is one.
    const active = runner?.queryRunner?.isTransactionActive ?? runner?.isTransactionActive;
    if (typeof runner?.query !== 'function' || active !== true) {
      throw new TypeError(
        'completeWithin needs the EntityManager or QueryRunner of an open transaction (dataSource.transaction(tx => ...))',
      );
    }
    const rows = (await runner.query(
      COMPLETE_SQL,
      completeParams(key, token, fingerprint, response, resultTtlMs),
    )) as unknown[];
    return Array.isArray(rows) && rows.length === 1;
  }

  /** The request gives up without knowing its outcome: its lock ends now and its row stays (tookOver for the next). */
  async abandon(key: string, token: string): Promise<boolean> {
    return (await this.query(ABANDON_SQL, [key, token])).length === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.query(RELEASE_SQL, [key, token, ENDED_FRAMES_TTL_MS])).length === 1;
  }

  async renew(key: string, token: string, lockTtlMs: number): Promise<boolean> {
    return (await this.query(RENEW_SQL, [key, token, lockTtlMs])).length === 1;
  }

  /** Deletes up to `limit` expired key rows and up to `limit` expired frame logs. */
  async sweepExpired(limit = this.sweepBatch): Promise<SweepResult> {
    const keys = await this.pool().query(SWEEP_KEYS_SQL, [limit]);
    const [frames] = await this.query<{ logs: number }>(SWEEP_FRAMES_SQL, [limit]);
    return { keys: keys.rowCount ?? 0, frameLogs: frames?.logs ?? 0 };
  }

  /** Sweeps every `sweepIntervalMs` (batch after batch while batches come back full), until `close()`. */
  startSweeping(): void {
    if (this.sweepTimer) return;
    this.sweepTimer = setInterval(() => {
      this.sweeping ??= this.sweepAll().finally(() => (this.sweeping = undefined));
    }, this.sweepIntervalMs);
    this.sweepTimer.unref();
  }

  async close(): Promise<void> {
    clearInterval(this.sweepTimer);
    this.sweepTimer = undefined;
    await this.sweeping;
    await this.listener.close();
  }

  private async sweepAll(): Promise<void> {
    try {
      for (let i = 0; i < MAX_BATCHES_PER_SWEEP; i++) {
        const { keys, frameLogs } = await this.sweepExpired();
        if (keys < this.sweepBatch && frameLogs < this.sweepBatch) return;
      }
    } catch (err) {
      this.logger.warn(
        `idempotency: sweeping expired keys failed: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
  }

  private pool(): Pool {
    if (this.db instanceof DataSource) {
      // TypeORM's postgres driver keeps its pg Pool as `master` (made by initialize()).
      const pool = (this.db.driver as unknown as { master?: Pool }).master;
      if (!pool) throw new Error('the DataSource is not initialized');
      return pool;
    }
    return this.db;
  }

  /**
   * The store's own statements (all but the sweep's DELETE and what
   * `completeWithin` runs in the caller's transaction) are named prepared
   * statements: each pooled connection parses and plans them once. That
   * needs a session per connection: behind a pooler in transaction mode
   * (PgBouncer before 1.21 without max_prepared_statements) they fail. A
   * migration that changes a returned column's type needs the apps
   * restarted, as prepared plans keep their result types. The claim is a few CTEs, and
   * planning it on every call cost more than running it (the bench measured
   * 1.4 ms a call unnamed, 0.33 ms named, on a replay).
   */
  private async query<R extends QueryResultRow = QueryResultRow>(sql: string, params: unknown[]): Promise<R[]> {
    return (await this.pool().query<R>({ name: statementName(sql), text: sql, values: params })).rows;
  }
}

const statementNames = new Map<string, string>();

/** A prepared statement's name, from its text: one text, one name, on every connection. */
function statementName(sql: string): string {
  let name = statementNames.get(sql);
  if (name === undefined) {
    name = `idempotency_${createHash('sha256').update(sql).digest('hex').slice(0, 16)}`;
    statementNames.set(sql, name);
  }
  return name;
}

/** The pool's connection settings for the LISTEN connection, which no statement timeout may end. */
function listenConfig(pool: Pool, applicationName: string): ClientConfig {
  const {
    max: _max,
    idleTimeoutMillis: _idle,
    statement_timeout: _st,
    query_timeout: _qt,
    ...connection
  } = pool.options as ClientConfig & {
    max?: number;
    idleTimeoutMillis?: number;
  };
  return { ...connection, application_name: applicationName, keepAlive: true, keepAliveInitialDelayMillis: 10_000 };
}

type Query = <R extends QueryResultRow = QueryResultRow>(sql: string, params: unknown[]) => Promise<R[]>;

interface FrameRow {
  seq: number;
  kind: 'head' | 'frame' | 'end';
  data: string | null;
}

/** The frame logs of PostgresIdempotencyStore's records. */
export class PostgresFrameLog implements IdempotencyFrameLog {
  constructor(
    private readonly query: Query,
    private readonly listener: PgNotificationListener,
    private readonly idleCheckMs: number,
  ) {}

  async begin(key: string, token: string, head: StoredHead): Promise<boolean> {
    const json = JSON.stringify({ status: head.status, headers: head.headers });
    return (await this.query(BEGIN_SQL, [key, token, json])).length === 1;
  }

  async append(key: string, token: string, frames: readonly string[]): Promise<boolean> {
    if (frames.length === 0) return true;
    return (await this.query(APPEND_SQL, [key, token, frames])).length === 1;
  }

  async complete(key: string, token: string, fingerprint: string, resultTtlMs: number): Promise<boolean> {
    return (await this.query(COMPLETE_FRAMES_SQL, [key, token, fingerprint, resultTtlMs])).length === 1;
  }

  /*
   * Subscribed before the first read, so news of anything written after a
   * read wakes the wait that follows it. Registered (WATCH) once caught up,
   * then read again: what was written before the registration is read, and
   * every end after it is written to the log. Without news for idleCheckMs
   * it checks that the attempt still holds its lock; once it does not (or
   * the registration finds it ended), one last read finds the end if one was
   * written, and otherwise the attempt died or its log expired: `gone`.
   */
  async *follow(ref: FramesRef, signal: AbortSignal): AsyncIterable<FrameEvent> {
    const { attempt, key } = parseRef(ref);
    if (signal.aborted) return;
    const news: Subscription = await this.listener.subscribe(attempt);
    try {
      let after = 0;
      let watched = false;
      let ended = false; // the attempt no longer runs: this read is the last
      while (!signal.aborted) {
        news.clear();
        const rows = await this.query<FrameRow>(READ_SQL, [attempt, after, PAGE]);
        for (const row of rows) {
          after = row.seq;
          if (signal.aborted) return;
          const event = toEvent(row);
          yield event;
          if (event.kind === 'end') return;
        }
        if (rows.length === PAGE) continue;
        if (ended) {
          if (!signal.aborted) yield { kind: 'gone' };
          return;
        }
        if (!watched) {
          watched = true;
          ended = (await this.query(WATCH_SQL, [key, attempt])).length === 0;
          continue;
        }
        if (await news.wait(this.idleCheckMs, signal)) continue;
        if (signal.aborted) return;
        ended = (await this.query(ALIVE_SQL, [key, attempt])).length === 0;
      }
    } finally {
      news.unsubscribe();
    }
  }
}

function toEvent(row: FrameRow): FrameEvent {
  switch (row.kind) {
    case 'head':
      return { kind: 'head', head: JSON.parse(row.data ?? '{}') as StoredHead };
    case 'frame':
      return { kind: 'frame', data: row.data ?? '' };
    case 'end':
      return { kind: 'end', outcome: row.data === 'completed' ? 'completed' : 'aborted' };
  }
}
