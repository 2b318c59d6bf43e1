import { Injectable, Logger, Optional } from '@nestjs/common';
import { DeadLetterQueue, type DeadLetter, type QueueFigures, type RedriveResult, SummaryJobQueue } from '@app/jobs';
import { OutboxAdminRepository, type OutboxFigures, type ParkedMessage } from '@app/persistence';
import { Counter, Registry } from 'prom-client';
import { DataSource } from 'typeorm';

export interface SystemFigures {
  readonly queue: QueueFigures;
  readonly outbox: OutboxFigures;
}

/** Who asked, for the log line of every change an operator makes. */
export type Actor = 'admin-api' | 'admin-cli';

/**
 * What an operator does to mend the system, shared by the admin API and the
 * admin CLI: look at the figures, the dead letters and the parked outbox
 * rows; re-drive dead letters; re-queue parked rows. Every change is logged
 * and counted (`admin_actions_total{action}` where the app has metrics).
 */
@Injectable()
export class OperationsService {
  private readonly logger = new Logger(OperationsService.name);
  private readonly actions: Counter<'action'>;

  constructor(
    private readonly deadLetters: DeadLetterQueue,
    private readonly queue: SummaryJobQueue,
    private readonly outbox: OutboxAdminRepository,
    private readonly dataSource: DataSource,
    @Optional() registry?: Registry,
  ) {
    this.actions = new Counter({
      name: 'admin_actions_total',
      help: 'Changes made by operators: dead letters re-driven, parked outbox rows re-queued',
      labelNames: ['action'],
      registers: registry ? [registry] : [],
    });
  }

  async figures(): Promise<SystemFigures> {
    const [queue, outbox] = await Promise.all([this.queue.figures(), this.outbox.figures(this.dataSource.manager)]);
    return { queue, outbox };
  }

  listDeadLetters(count?: number, after?: string): Promise<DeadLetter[]> {
    return this.deadLetters.list(count, after);
  }

  async redrive(id: string, actor: Actor): Promise<RedriveResult> {
    const result = await this.deadLetters.redrive(id);
    if (result.outcome === 'redriven') {
      this.actions.inc({ action: 'redrive' });
      this.logger.log({ actor, dead_letter: id, job_id: result.jobId, entry: result.entryId }, 'dead letter re-driven');
    }
    return result;
  }

  async redriveAll(actor: Actor): Promise<{ redriven: number; notRedrivable: string[] }> {
    const result = await this.deadLetters.redriveAll();
    this.actions.inc({ action: 'redrive' }, result.redriven);
    this.logger.log({ actor, redriven: result.redriven, not_redrivable: result.notRedrivable }, 'dead letters re-driven');
    return result;
  }

  listParked(limit?: number): Promise<ParkedMessage[]> {
    return this.outbox.listParked(this.dataSource.manager, limit);
  }

  /** One parked row by id, or every parked row; returns the ids re-queued. */
  async requeue(actor: Actor, id?: string): Promise<string[]> {
    const ids = await this.outbox.requeueParked(this.dataSource.manager, id);
    this.actions.inc({ action: 'requeue' }, ids.length);
    if (ids.length > 0) this.logger.log({ actor, outbox_ids: ids }, 'parked outbox rows re-queued');
    return ids;
  }
}
