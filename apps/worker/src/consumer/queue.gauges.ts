import { Injectable, Logger } from '@nestjs/common';
import { type PartitionFigures, SummaryJobQueue, type QueueFigures, SummaryStreams } from '@app/summary-queue';
import { scrapeOnce } from '@app/observability';
import { Gauge, Registry } from 'prom-client';

/**
 * Queue depth, read from Redis at scrape time (one pipelined round trip per
 * partition, once for all the gauges): what to alert on when it only grows.
 * The totals keep their names (alerts, dashboards and autoscalers read them);
 * each partition's figures are separate gauges with a `partition` label, so a
 * `sum()` over either never counts a job twice.
 */
@Injectable()
export class QueueGauges {
  private readonly logger = new Logger(QueueGauges.name);

  constructor(registry: Registry, queue: SummaryJobQueue, streams: SummaryStreams) {
    const zero = (partition: number): PartitionFigures => ({ partition, length: 0, pending: 0, deadLetters: 0 });
    const figures = scrapeOnce<QueueFigures>(
      () => queue.figures(),
      { length: 0, pending: 0, deadLetters: 0, partitions: streams.partitions.map((p) => zero(p.index)) },
      (err) => this.logger.warn(`queue gauges not refreshed: ${err instanceof Error ? err.message : String(err)}`),
    );
    const gauge = (name: string, help: string, pick: (f: PartitionFigures | QueueFigures) => number) => {
      new Gauge({
        name,
        help,
        registers: [registry],
        async collect() {
          this.set(pick(await figures()));
        },
      });
      new Gauge({
        name: name.replace(/^jobs_(stream|dead_letter)_/, 'jobs_$1_partition_'),
        help: `${help}, by partition (JOB_STREAM_PARTITIONS)`,
        labelNames: ['partition'],
        registers: [registry],
        async collect() {
          for (const f of (await figures()).partitions) this.set({ partition: String(f.partition) }, pick(f));
        },
      });
    };
    gauge(
      'jobs_stream_length',
      'Entries in the job stream: not yet acknowledged (acked entries are deleted)',
      (f) => f.length,
    );
    gauge('jobs_stream_pending', 'Entries delivered to a consumer and not yet acknowledged', (f) => f.pending);
    gauge('jobs_dead_letter_length', 'Entries in the dead-letter stream', (f) => f.deadLetters);
  }
}
