import { Injectable, Logger } from '@nestjs/common';
import { SummaryJobQueue, type QueueFigures } from '@app/summary-queue';
import { scrapeOnce } from '@app/observability';
import { Gauge, Registry } from 'prom-client';

/**
 * Queue depth, read from Redis at scrape time (one pipelined round trip for
 * the three gauges): what to alert on when it only grows.
 */
@Injectable()
export class QueueGauges {
  private readonly logger = new Logger(QueueGauges.name);

  constructor(registry: Registry, queue: SummaryJobQueue) {
    const figures = scrapeOnce<QueueFigures>(
      () => queue.figures(),
      { length: 0, pending: 0, deadLetters: 0 },
      (err) => this.logger.warn(`queue gauges not refreshed: ${err instanceof Error ? err.message : String(err)}`),
    );
    const gauge = (name: string, help: string, pick: (f: QueueFigures) => number) =>
      new Gauge({
        name,
        help,
        registers: [registry],
        async collect() {
          this.set(pick(await figures()));
        },
      });
    gauge(
      'jobs_stream_length',
      'Entries in the job stream: not yet acknowledged (acked entries are deleted)',
      (f) => f.length,
    );
    gauge('jobs_stream_pending', 'Entries delivered to a consumer and not yet acknowledged', (f) => f.pending);
    gauge('jobs_dead_letter_length', 'Entries in the dead-letter stream', (f) => f.deadLetters);
  }
}
