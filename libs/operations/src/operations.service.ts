import { Injectable, Logger, Optional } from '@nestjs/common';
import {
  DeadLetterQueue,
  type DeadLetterBounds,
  type DeadLetterDetail,
  type DeadLetterFilter,
  type DeadLetterPage,
  matchesFilter,
  type RedriveResult,
} from '@app/summary-queue';
import { OperatedQueues, type QueueFigures, queueFigures } from '@app/workflows';
import { InjectRedis, type RedisClient } from '@app/redis';
import { OutboxAdminRepository, type OutboxFigures, type ParkedMessage } from '@app/persistence';
import { Counter, Registry } from 'prom-client';
import { DataSource } from 'typeorm';
import { ADMIN_ACTIONS, AdminActionCounts } from './admin-action-counts';

export interface NamedQueueFigures extends QueueFigures {
  /** `summaries`, `workflows`. */
  readonly name: string;
  readonly group: string;
}

/** One workflow's figures: its dead letters (in whichever queue) and its runs that failed (still kept). */
export interface WorkflowFigures {
  readonly name: string;
  readonly deadLetters: number;
  readonly failedRuns: number;
}

export interface SystemFigures {
  /** The summaries queue, as it always was. */
  readonly queue: QueueFigures;
  readonly outbox: OutboxFigures;
  /** Every queue, summaries included. */
  readonly queues: readonly NamedQueueFigures[];
  /** With a workflow filter: that workflow's own figures. */
  readonly workflow?: WorkflowFigures;
}

/** Who asked, for the log line of every change an operator makes. */
export type Actor = 'admin-api' | 'admin-cli';

export interface RedriveAllResult {
  readonly redriven: number;
  /** Dead letters that have no job to run (recorded by id only); they stay. */
  readonly notRedrivable: string[];
  /**
   * Set when the limit stopped the walk: call again with `after` = this to go
   * on. The last dead letter looked at, which may not be of the workflow.
   */
  readonly next?: string;
}

export interface RedriveAllOptions {
  /** Dead letters to look at (of any workflow). */
  readonly limit?: number;
  readonly after?: string;
  readonly workflow?: string;
  /**
   * Where the walk ends (deadLetterBounds()): what is dead-lettered later, a
   * re-drive that failed again at once, is left for another walk. Default:
   * the newest dead letters as this call starts.
   */
  readonly until?: DeadLetterBounds;
}

/** How many dead letters one bulk re-drive looks at, so one call stays short. */
export const REDRIVE_ALL_DEFAULT_LIMIT = 1000;

/**
 * What an operator does to mend the system, shared by the admin API and the
 * admin CLI: look at the figures, the dead letters and the parked outbox
 * rows; re-drive dead letters; re-queue parked rows. Every change is logged,
 * one line per dead letter or row, and counted for the whole system in Redis
 * (`admin_actions_total{action}` on the api's /metrics), so the CLI's changes
 * are counted too.
 */
@Injectable()
export class OperationsService {
  private readonly logger = new Logger(OperationsService.name);

  constructor(
    private readonly deadLetters: DeadLetterQueue,
    private readonly outbox: OutboxAdminRepository,
    private readonly dataSource: DataSource,
    private readonly counts: AdminActionCounts,
    private readonly queues: OperatedQueues,
    @InjectRedis() private readonly redis: RedisClient,
    @Optional() registry?: Registry,
  ) {
    if (registry) this.registerMetric(registry);
  }

  /**
   * Every queue's figures, summaries' (the first) also as `queue`; with a
   * workflow, its own figures too: its dead letters are counted by reading
   * every dead letter once (a dead letter names its workflow inside).
   */
  async figures(filter: DeadLetterFilter = {}): Promise<SystemFigures> {
    const [outbox, queues, workflow] = await Promise.all([
      this.outbox.figures(this.dataSource.manager),
      Promise.all(
        this.queues.all.map(async (q) => ({
          name: q.name,
          group: q.group,
          ...(await queueFigures(this.redis, q.layout, q.group)),
        })),
      ),
      filter.workflow === undefined ? undefined : this.workflowFigures(filter.workflow),
    ]);
    const { name: _name, group: _group, ...queue } = queues[0];
    return workflow ? { queue, outbox, queues, workflow } : { queue, outbox, queues };
  }

  /** A page; with a filter it looks at a bounded number of dead letters, and `next` goes on from there. */
  listDeadLetters(count?: number, after?: string, filter?: DeadLetterFilter): Promise<DeadLetterPage> {
    return this.deadLetters.list(count, after, filter);
  }

  /** One dead letter with every field of its entry; undefined when there is none. */
  inspectDeadLetter(id: string): Promise<DeadLetterDetail | undefined> {
    return this.deadLetters.inspect(id);
  }

  /** Each dead-letter stream's newest id: the end of a re-drive that spans several redriveAll calls. */
  deadLetterBounds(): Promise<DeadLetterBounds> {
    return this.deadLetters.newest();
  }

  /** Counted by the re-drive script itself, atomically with the re-drive. */
  async redrive(id: string, actor: Actor): Promise<RedriveResult> {
    const result = await this.deadLetters.redrive(id);
    if (result.outcome === 'redriven') {
      this.logger.log(
        {
          actor,
          dead_letter: result.deadLetter,
          job_id: result.jobId,
          workflow: result.workflow,
          entry: result.entryId,
        },
        'dead letter re-driven',
      );
    }
    return result;
  }

  /**
   * Every dead letter that can run again, oldest first, from after `after`
   * up to `until`, looking at `limit` dead letters at most (of any workflow:
   * so a call stays short whatever the filter); each re-drive is logged on
   * its own.
   */
  async redriveAll(
    actor: Actor,
    { limit = REDRIVE_ALL_DEFAULT_LIMIT, after, workflow, until }: RedriveAllOptions = {},
  ): Promise<RedriveAllResult> {
    const filter: DeadLetterFilter = workflow === undefined ? {} : { workflow };
    const walk = this.deadLetters.walk({ after, until: until ?? (await this.deadLetters.newest()), examine: limit });
    let redriven = 0;
    const notRedrivable: string[] = [];
    let last: string | undefined;
    for (let seen = 0; seen < limit; seen++) {
      const letter = await walk.next();
      if (!letter) return { redriven, notRedrivable };
      last = letter.id;
      if (!matchesFilter(letter, filter)) continue;
      const result = await this.redrive(letter.id, actor);
      if (result.outcome === 'redriven') redriven++;
      else if (result.outcome === 'not_redrivable') notRedrivable.push(letter.id);
    }
    return last !== undefined && (await walk.more())
      ? { redriven, notRedrivable, next: last }
      : { redriven, notRedrivable };
  }

  private async workflowFigures(name: string): Promise<WorkflowFigures> {
    const [deadLetters, [failed]] = await Promise.all([
      this.deadLetters.length({ workflow: name }),
      // workflow_runs_failed_idx: an index-only count, however many runs are kept.
      this.dataSource.query<{ n: string }[]>(
        `SELECT count(*) AS n FROM workflow_runs WHERE workflow = $1 AND status = 'failed'`,
        [name],
      ),
    ]);
    return { name, deadLetters, failedRuns: Number(failed.n) };
  }

  listParked(limit?: number): Promise<ParkedMessage[]> {
    return this.outbox.listParked(this.dataSource.manager, limit);
  }

  /** One parked row by id, or every parked row; returns the ids re-queued. */
  async requeue(actor: Actor, id?: string): Promise<string[]> {
    const ids = await this.outbox.requeueParked(this.dataSource.manager, id);
    if (ids.length === 0) return ids;
    for (const outboxId of ids) this.logger.log({ actor, outbox_id: outboxId }, 'parked outbox row re-queued');
    try {
      await this.counts.add('requeue', ids.length);
    } catch (err) {
      // The rows are re-queued (committed); only the count is missing.
      this.logger.warn(
        { actor, requeued: ids.length, err: (err as Error).message },
        're-queue not counted: Redis did not answer',
      );
    }
    return ids;
  }

  /**
   * The counts live in Redis and are read at scrape time; if Redis does not
   * answer, the last values read stay (a counter never goes backwards here).
   */
  private registerMetric(registry: Registry): void {
    const counts = this.counts;
    const logger = this.logger;
    new Counter({
      name: 'admin_actions_total',
      help: 'Changes made by operators through the admin API or CLI, for the whole system (kept in Redis): dead letters re-driven, parked outbox rows re-queued',
      labelNames: ['action'],
      registers: [registry],
      async collect() {
        try {
          const now = await counts.read();
          this.reset();
          for (const action of ADMIN_ACTIONS) this.inc({ action }, now[action]);
        } catch (err) {
          logger.warn({ err: (err as Error).message }, 'admin_actions_total not refreshed: Redis did not answer');
        }
      },
    });
  }
}
