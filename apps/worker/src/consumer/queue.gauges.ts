import { Injectable, Logger } from '@nestjs/common';
import { scrapeOnce } from '@app/observability';
import { InjectRedis, type RedisClient } from '@app/redis';
import {
  OperatedQueues,
  type OperatedQueue,
  type PartitionFigures,
  type QueueFigures,
  queueFigures,
} from '@app/workflows';
import { Gauge, Registry } from 'prom-client';

type Figures = PartitionFigures | QueueFigures;

/**
 * Queue depth, read from Redis at scrape time (one pipelined round trip per
 * partition of each queue, once for all the gauges): what to alert on when it
 * only grows. Every queue the admin tools cover (OperatedQueues: summaries,
 * the shared workflows queue) has its gauges with a `queue` label. The first
 * gauges, summaries' alone without that label, keep their names (alerts,
 * dashboards and autoscalers read them). Totals and each partition's figures
 * are separate gauges (a `partition` label), so a `sum()` over either never
 * counts a job twice.
 */
@Injectable()
export class QueueGauges {
  private readonly logger = new Logger(QueueGauges.name);

  constructor(registry: Registry, queues: OperatedQueues, @InjectRedis() redis: RedisClient) {
    const zero = (q: OperatedQueue): QueueFigures => ({
      length: 0,
      pending: 0,
      deadLetters: 0,
      partitions: q.layout.partitions.map((p) => ({ partition: p.index, length: 0, pending: 0, deadLetters: 0 })),
    });
    const figures = scrapeOnce<readonly QueueFigures[]>(
      () => Promise.all(queues.all.map((q) => queueFigures(redis, q.layout, q.group))),
      queues.all.map(zero),
      (err) => this.logger.warn(`queue gauges not refreshed: ${err instanceof Error ? err.message : String(err)}`),
    );
    const summaries = async () => (await figures())[0];
    const byQueue = async () => (await figures()).map((f, i) => ({ queue: queues.all[i].name, f }));
    const gauge = (name: string, help: string, pick: (f: Figures) => number) => {
      const partitionName = (prefix: string) => name.replace(/^jobs_(stream|dead_letter)_/, `${prefix}_$1_partition_`);
      // Summaries', as they always were.
      new Gauge({
        name,
        help,
        registers: [registry],
        async collect() {
          this.set(pick(await summaries()));
        },
      });
      new Gauge({
        name: partitionName('jobs'),
        help: `${help}, by partition (JOB_STREAM_PARTITIONS)`,
        labelNames: ['partition'],
        registers: [registry],
        async collect() {
          for (const f of (await summaries()).partitions) this.set({ partition: String(f.partition) }, pick(f));
        },
      });
      // Every queue's.
      new Gauge({
        name: name.replace(/^jobs_/, 'queue_'),
        help: `${help}, by queue`,
        labelNames: ['queue'],
        registers: [registry],
        async collect() {
          for (const { queue, f } of await byQueue()) this.set({ queue }, pick(f));
        },
      });
      new Gauge({
        name: partitionName('queue'),
        help: `${help}, by queue and partition`,
        labelNames: ['queue', 'partition'],
        registers: [registry],
        async collect() {
          for (const { queue, f } of await byQueue())
            for (const p of f.partitions) this.set({ queue, partition: String(p.partition) }, pick(p));
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
