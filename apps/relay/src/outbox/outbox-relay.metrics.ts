import { Injectable, Logger } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { DataSource } from 'typeorm';
import { scrapeOnce } from '@app/observability';
import { OutboxAdminRepository, type OutboxFigures } from '@app/persistence';

/** What happened to one claimed row: its recorded result. */
export type SendOutcome = 'sent' | 'failed' | 'parked';

/**
 * The relay's figures in the app's registry. The counters count what this
 * process recorded; the gauges describe the table (every relay reports the
 * same values) and are read from PostgreSQL on scrape.
 */
@Injectable()
export class OutboxRelayMetrics {
  private readonly logger = new Logger(OutboxRelayMetrics.name);
  private readonly sends: Counter<'outcome'>;
  private readonly duration: Histogram<'outcome'>;
  private readonly leaseLost: Counter;

  constructor(registry: Registry, dataSource: DataSource, figures: OutboxAdminRepository) {
    const registers = [registry];
    this.sends = new Counter({
      name: 'outbox_sends_total',
      help: 'Outbox rows by recorded result: sent, failed (to be tried again) or parked (out of attempts)',
      labelNames: ['outcome'],
      registers,
    });
    for (const outcome of ['sent', 'failed', 'parked'] as const) this.sends.labels(outcome).inc(0);
    this.duration = new Histogram({
      name: 'outbox_send_duration_seconds',
      help: 'Time from starting a send to the answer of the provider (or the timeout), by whether it was accepted',
      labelNames: ['outcome'],
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers,
    });
    this.leaseLost = new Counter({
      name: 'outbox_lease_lost_total',
      help: 'Send results not recorded because the lease had expired and another relay had claimed the row (which sends it again)',
      registers,
    });
    // One query per scrape for the three gauges.
    const stats = scrapeOnce<OutboxFigures>(
      () => figures.figures(dataSource.manager),
      { backlog: 0, oldestUnsentAgeSeconds: 0, parked: 0 },
      (err) => this.logger.warn(`outbox gauges not refreshed: ${err instanceof Error ? err.message : String(err)}`),
    );
    new Gauge({
      name: 'outbox_backlog_rows',
      help: 'Outbox rows not sent yet and not parked',
      registers,
      async collect() {
        this.set((await stats()).backlog);
      },
    });
    new Gauge({
      name: 'outbox_oldest_unsent_age_seconds',
      help: 'Age of the oldest outbox row not sent yet and not parked; 0 when there is none',
      registers,
      async collect() {
        this.set((await stats()).oldestUnsentAgeSeconds);
      },
    });
    new Gauge({
      name: 'outbox_parked_rows',
      help: 'Outbox rows that ran out of attempts and wait for a person (docs/operations.md: re-queue)',
      registers,
      async collect() {
        this.set((await stats()).parked);
      },
    });
  }

  recorded(outcome: SendOutcome): void {
    this.sends.inc({ outcome });
  }

  sendDuration(seconds: number, accepted: boolean): void {
    this.duration.observe({ outcome: accepted ? 'sent' : 'failed' }, seconds);
  }

  leaseWasLost(): void {
    this.leaseLost.inc();
  }
}
