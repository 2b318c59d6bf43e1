import {
  type BeforeApplicationShutdown,
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type Provider,
} from '@nestjs/common';
import { HealthChecksRegistry } from '@app/health';
import { deleteInBatches } from '@app/persistence';
import { setTimeout as delay } from 'node:timers/promises';
import { DataSource } from 'typeorm';

export const WORKFLOW_RUN_RETENTION_OPTIONS = 'workflows:run-retention-options';
export const RETENTION_LOOP = 'workflow-run-retention';

export interface WorkflowRunRetentionOptions {
  /** WORKFLOW_RUN_RETENTION_DAYS: finished runs older than this go; 0 keeps them for ever (the sweep never runs). */
  readonly retentionDays: number;
  /** Runs per DELETE statement (their steps go with them). Default 500. */
  readonly batch?: number;
  /** Between two sweeps (the first at start). Default hourly. */
  readonly intervalMs?: number;
  /** The pause after a full batch, so a large backlog is deleted at a pace the database shrugs off. Default 100. */
  readonly pauseMs?: number;
  /** Liveness fails when the loop has not turned for this long (one statement hanging). Default 5 minutes. */
  readonly maxSilenceMs?: number;
  /**
   * A batch waits this long at most for a lock (a step committing holds its
   * rows); then it is left for the next sweep. Default 5 s.
   */
  readonly lockTimeoutMs?: number;
  /** A batch's statement runs this long at most, well under maxSilenceMs. Default a fifth of it, at most 60 s. */
  readonly statementTimeoutMs?: number;
  /** Start on application bootstrap. Default true; tests call runOnce() instead. */
  readonly autoStart?: boolean;
}

const BATCH = 500;
const INTERVAL_MS = 60 * 60 * 1000;
const PAUSE_MS = 100;
const MAX_SILENCE_MS = 5 * 60 * 1000;
const LOCK_TIMEOUT_MS = 5000;
const STATEMENT_TIMEOUT_MS = 60_000;
/** The idle wait between sweeps beats this often, so that liveness needs no silence as long as the interval. */
const IDLE_BEAT_MS = 10_000;

/*
 * At most $2 runs finished (done or failed) more than $1 days ago, with
 * their steps (ON DELETE CASCADE). Failed runs go too: a dead letter is not
 * in PostgreSQL, so whether one may still be re-driven is not known here (a
 * re-drive after the retention runs the step again without the run's
 * history: docs/operations.md). A failed run that a re-drive set running
 * again is not deleted under its own feet, whatever its finished_at says.
 * SKIP LOCKED: a run a step is committing is left for the next sweep, and
 * several workers sweep side by side. The partial index on finished_at
 * finds the candidates.
 */
const DELETE_FINISHED = `WITH gone AS (
  DELETE FROM workflow_runs
   WHERE run_id IN (
     SELECT run_id FROM workflow_runs
      WHERE finished_at < now() - $1::integer * interval '1 day'
        AND status IN ('done', 'failed')
      LIMIT $2
      FOR UPDATE SKIP LOCKED
   )
  RETURNING 1
)
SELECT count(*)::integer AS n FROM gone`;

/** PostgreSQL's lock_timeout (55P03) and statement_timeout (57014): the batch gave up, nothing is wrong. */
function isTimeout(err: unknown): boolean {
  const code =
    (err as { code?: unknown; driverError?: { code?: unknown } }).code ??
    (err as { driverError?: { code?: unknown } }).driverError?.code;
  return code === '55P03' || code === '57014';
}

/**
 * Deletes finished workflow runs past WORKFLOW_RUN_RETENTION_DAYS, in small
 * batches (short locks, short WAL bursts), once at start and then every
 * interval, as the relay's outbox retention does for sent rows. A loop like
 * the others: started on bootstrap, stopped before shutdown (a running
 * statement finishes), reporting each turn to liveness.
 */
@Injectable()
export class WorkflowRunRetention implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger(WorkflowRunRetention.name);
  private stopping = new AbortController();
  private loop: Promise<void> | undefined;

  constructor(
    @Inject(WORKFLOW_RUN_RETENTION_OPTIONS) private readonly options: WorkflowRunRetentionOptions,
    private readonly dataSource: DataSource,
    private readonly health: HealthChecksRegistry,
  ) {}

  onApplicationBootstrap(): void {
    if (this.options.autoStart ?? true) this.start();
  }

  beforeApplicationShutdown(): Promise<void> {
    return this.stop();
  }

  /** Starts the loop; with a retention of 0 days there is nothing to sweep, for ever. */
  start(): void {
    if (this.loop) return;
    if (this.options.retentionDays === 0) {
      this.logger.log('finished workflow runs are kept for ever (WORKFLOW_RUN_RETENTION_DAYS=0)');
      return;
    }
    this.stopping = new AbortController();
    this.health.registerLoop(RETENTION_LOOP, this.options.maxSilenceMs ?? MAX_SILENCE_MS);
    this.loop = this.run();
  }

  /** Ends the idle wait and the pauses; the statement running, if any, finishes first. */
  async stop(): Promise<void> {
    this.stopping.abort();
    await this.loop;
    this.loop = undefined;
    this.health.unregisterLoop(RETENTION_LOOP);
  }

  /**
   * One sweep: batches until one comes back short (or stop() is called);
   * returns the runs deleted. A batch that timed out ends the sweep: the
   * next one tries again.
   */
  runOnce(): Promise<number> {
    return deleteInBatches((limit) => this.deleteBatch(limit), {
      limit: this.options.batch ?? BATCH,
      stopped: () => this.stopping.signal.aborted,
      beforeEach: () => this.health.beat(RETENTION_LOOP),
      between: () => this.pause(this.options.pauseMs ?? PAUSE_MS),
    });
  }

  /**
   * One batch, in a transaction of its own whose lock and statement timeouts
   * keep it from hanging the loop: past either it deletes nothing (logged),
   * and the runs are left for the next sweep.
   */
  async deleteBatch(limit = this.options.batch ?? BATCH): Promise<number> {
    const lockTimeoutMs = this.options.lockTimeoutMs ?? LOCK_TIMEOUT_MS;
    const statementTimeoutMs =
      this.options.statementTimeoutMs ??
      Math.min(STATEMENT_TIMEOUT_MS, Math.floor((this.options.maxSilenceMs ?? MAX_SILENCE_MS) / 5));
    try {
      return await this.dataSource.transaction(async (em) => {
        // SET takes no parameters: whole numbers of milliseconds, from the options.
        await em.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.trunc(lockTimeoutMs))}`);
        await em.query(`SET LOCAL statement_timeout = ${Math.max(1, Math.trunc(statementTimeoutMs))}`);
        const [{ n }] = await em.query<{ n: number }[]>(DELETE_FINISHED, [this.options.retentionDays, limit]);
        return n;
      });
    } catch (err) {
      if (!isTimeout(err)) throw err;
      this.logger.warn(
        `workflow run retention: a batch timed out (${(err as Error).message}); the next sweep tries again`,
      );
      return 0;
    }
  }

  private async run(): Promise<void> {
    const interval = this.options.intervalMs ?? INTERVAL_MS;
    while (!this.stopping.signal.aborted) {
      try {
        const deleted = await this.runOnce();
        if (deleted > 0) {
          this.logger.log(
            `retention: deleted ${deleted} finished workflow runs older than ${this.options.retentionDays} days`,
          );
        }
      } catch (err) {
        // The database may be down: the next sweep tries again; readiness reports the database.
        this.logger.warn(`workflow run retention failed: ${(err as Error).message}`);
      }
      const until = performance.now() + interval;
      while (!this.stopping.signal.aborted && performance.now() < until) {
        this.health.beat(RETENTION_LOOP);
        await this.pause(Math.min(IDLE_BEAT_MS, until - performance.now()));
      }
    }
  }

  /** Sleeps `ms`, or less when stop() is called. */
  private pause(ms: number): Promise<void> {
    return delay(Math.max(0, ms), undefined, { signal: this.stopping.signal }).catch(() => undefined);
  }
}

/**
 * The worker's providers for the sweep (it needs the global DataSource and
 * HealthChecksRegistry): `...workflowRunRetentionProviders({ retentionDays:
 * config.workflowRunRetentionDays })`.
 */
export function workflowRunRetentionProviders(options: WorkflowRunRetentionOptions): Provider[] {
  return [{ provide: WORKFLOW_RUN_RETENTION_OPTIONS, useValue: options }, WorkflowRunRetention];
}
