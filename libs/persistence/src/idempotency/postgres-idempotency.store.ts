import { Logger } from '@nestjs/common';
import type { ClaimResult, IdempotencyStore, PeekResult, StoredResponse } from '@app/idempotency';
import { randomUUID } from 'node:crypto';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';
import type { ClientConfig, Pool, QueryResultRow } from 'pg';
import { PgNotificationListener } from './pg-notification-listener';
import { PostgresFrameLog } from './postgres-frame-log';
import { IDEMPOTENCY_FRAMES_CHANNEL, IdempotencySql, statementName, textBody } from './postgres-idempotency.sql';
import { type ClaimRow, claimResultOf } from './postgres-idempotency.rows';

// Part of @app/persistence's surface since the store was one file.
export { PostgresFrameLog } from './postgres-frame-log';
export { claimResultOf } from './postgres-idempotency.rows';

/** How long an ended log that no completed record names (a freed attempt) stays, for its followers to read the end. */
const ENDED_FRAMES_TTL_MS = 60_000;
const DEFAULT_SWEEP_BATCH = 500;
const DEFAULT_SWEEP_INTERVAL_MS = 60_000;
const DEFAULT_SWEEP_BUDGET = 20;

export interface PostgresIdempotencyStoreOptions {
  /** How long a follower waits for news before it checks that the request is still alive. Default 1000. */
  readonly idleCheckMs?: number;
  /** Rows per sweep statement. Default 500. */
  readonly sweepBatch?: number;
  /** How often `startSweeping()` sweeps, while a sweep leaves nothing expired behind. Default a minute. */
  readonly sweepIntervalMs?: number;
  /** Batches one sweep runs at most; past them it says there is more, and the next sweep starts at once. Default 20. */
  readonly sweepBudget?: number;
  /** Shown in pg_stat_activity for the LISTEN connection. Default `idempotency-listen`. */
  readonly listenApplicationName?: string;
}

export interface SweepResult {
  /** Key rows deleted. */
  readonly keys: number;
  /** Frame logs deleted (whole). */
  readonly frameLogs: number;
}

export interface SweepRun extends SweepResult {
  /** The sweep spent its budget (or was closed) with a full batch last: more may have expired. */
  readonly more: boolean;
}

/** IdempotencySql.complete's parameters, alike on the store's pool and in a caller's transaction. */
function completeParams(
  key: string,
  token: string,
  fingerprint: string,
  response: StoredResponse,
  resultTtlMs: number,
): unknown[] {
  const body = textBody(response.body);
  return [
    key,
    token,
    fingerprint,
    response.status,
    JSON.stringify(response.headers),
    body.text,
    resultTtlMs,
    ENDED_FRAMES_TTL_MS,
    body.bytes,
  ];
}

/**
 * A TypeORM DataSource on PostgreSQL, as far as the store needs one (its
 * driver's pool). Named by shape, not imported: the store is also packaged
 * for apps without TypeORM (@llm-workflows/nestjs-idempotency/postgres).
 */
export interface DataSourceLike {
  readonly driver: object;
}

type Db = Pool | DataSourceLike;

/**
 * IdempotencyStore in PostgreSQL: one row per key, claimed in one statement,
 * every change conditional on the holder's token; streamed answers as frame
 * logs that followers read in pages and wait on through one LISTEN
 * connection per store. Built on a pg Pool or on a TypeORM DataSource (its
 * pool: the queries are SQL as written, not entity calls). Call
 * `startSweeping()` to delete expired rows periodically; `close()` ends the
 * LISTEN connection and the sweep, not the pool. The table, its frame logs
 * and every statement: postgres-idempotency.sql.ts; what a row means:
 * postgres-idempotency.rows.ts; the logs: PostgresFrameLog.
 */
export class PostgresIdempotencyStore implements IdempotencyStore {
  private readonly logger = new Logger(PostgresIdempotencyStore.name);
  private readonly sweepBatch: number;
  private readonly sweepIntervalMs: number;
  private readonly sweepBudget: number;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;
  private closed = false;
  private readonly listener: PgNotificationListener;
  readonly frames: PostgresFrameLog;

  constructor(
    private readonly db: Db,
    options: PostgresIdempotencyStoreOptions = {},
  ) {
    this.sweepBatch = options.sweepBatch ?? DEFAULT_SWEEP_BATCH;
    this.sweepIntervalMs = options.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS;
    this.sweepBudget = Math.max(1, options.sweepBudget ?? DEFAULT_SWEEP_BUDGET);
    const applicationName = options.listenApplicationName ?? 'idempotency-listen';
    this.listener = new PgNotificationListener(IDEMPOTENCY_FRAMES_CHANNEL, () =>
      listenConfig(this.pool(), applicationName),
    );
    this.frames = new PostgresFrameLog(
      (sql, params) => this.query(sql, params),
      this.listener,
      options.idleCheckMs ?? 1000,
    );
  }

  async claim(key: string, token: string, fingerprint: string, lockTtlMs: number): Promise<ClaimResult> {
    const rows = await this.query<ClaimRow>(IdempotencySql.claim, [key, token, fingerprint, lockTtlMs, randomUUID()]);
    if (rows.length !== 1) throw new Error(`idempotency claim returned ${rows.length} rows`);
    return claimResultOf(rows[0], key);
  }

  async peek(key: string): Promise<PeekResult> {
    const rows = await this.query<ClaimRow>(IdempotencySql.peek, [key]);
    if (rows.length === 0) return { outcome: 'absent' };
    return claimResultOf(rows[0], key) as PeekResult;
  }

  async complete(
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean> {
    return (
      (await this.query(IdempotencySql.complete, completeParams(key, token, fingerprint, response, resultTtlMs)))
        .length === 1
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
      IdempotencySql.complete,
      completeParams(key, token, fingerprint, response, resultTtlMs),
    )) as unknown[];
    return Array.isArray(rows) && rows.length === 1;
  }

  /** The request gives up without knowing its outcome: its lock ends now and its row stays (tookOver for the next). */
  async abandon(key: string, token: string): Promise<boolean> {
    return (await this.query(IdempotencySql.abandon, [key, token])).length === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.query(IdempotencySql.release, [key, token, ENDED_FRAMES_TTL_MS])).length === 1;
  }

  async renew(key: string, token: string, lockTtlMs: number): Promise<boolean> {
    return (await this.query(IdempotencySql.renew, [key, token, lockTtlMs])).length === 1;
  }

  /** Deletes up to `limit` expired key rows and up to `limit` expired frame logs. */
  async sweepExpired(limit = this.sweepBatch): Promise<SweepResult> {
    const keys = await this.pool().query(IdempotencySql.sweepKeys, [limit]);
    const [frames] = await this.query<{ logs: number }>(IdempotencySql.sweepFrames, [limit]);
    return { keys: keys.rowCount ?? 0, frameLogs: frames?.logs ?? 0 };
  }

  /**
   * One sweep: batch after batch until a batch comes back short, so what had
   * expired is gone when it ends, unless it spends its budget first
   * (`sweepBudget` batches): then it says `more`, and `startSweeping()` runs
   * the next one at once. Not a cap a minute (one of 10,000 rows made the
   * table grow for ever past ~167 keyed requests a second), and not a loop
   * that holds a pool connection flat out through a backlog (after a deploy,
   * an outage): between batches it yields to the event loop, and between
   * sweeps it goes back through the timer. Each statement stays a batch, so
   * none holds its locks for long, and the sweeps of several instances take
   * different rows. After `close()` it sweeps nothing.
   */
  async sweep(): Promise<SweepRun> {
    let keys = 0;
    let frameLogs = 0;
    for (let batches = 1; !this.closed; batches++) {
      const batch = await this.sweepExpired();
      keys += batch.keys;
      frameLogs += batch.frameLogs;
      if (batch.keys < this.sweepBatch && batch.frameLogs < this.sweepBatch) return { keys, frameLogs, more: false };
      if (batches >= this.sweepBudget) break;
      await yieldToEventLoop();
    }
    return { keys, frameLogs, more: keys + frameLogs > 0 };
  }

  /**
   * Sweeps now, then every `sweepIntervalMs`, or at once while a sweep
   * leaves more (one sweep at a time), until `close()`. The first sweep is
   * at the start: an instance that starts after a pause takes the backlog
   * then, not a minute on.
   */
  startSweeping(): void {
    if (this.sweepTimer || this.closed) return;
    this.scheduleSweep(0);
  }

  private scheduleSweep(delayMs: number): void {
    this.sweepTimer = setTimeout(() => {
      this.sweeping = this.sweep()
        .then(
          (run) => run.more,
          (err: unknown) => {
            this.logger.warn(
              `idempotency: sweeping expired keys failed: ${err instanceof Error ? err.message : String(err)}`,
            );
            return false;
          },
        )
        .then((more) => {
          this.sweeping = undefined;
          if (!this.closed) this.scheduleSweep(more ? 0 : this.sweepIntervalMs);
        });
    }, delayMs);
    this.sweepTimer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.sweepTimer);
    this.sweepTimer = undefined;
    await this.sweeping;
    await this.listener.close();
  }

  private pool(): Pool {
    if ('driver' in this.db) {
      // TypeORM's postgres driver keeps its pg Pool as `master` (made by initialize()); a pg Pool has no `driver`.
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
