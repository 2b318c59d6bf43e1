import { Injectable, Logger } from '@nestjs/common';
import { scrapeOnce } from '@app/observability';
import { InjectRedis, type RedisClient } from '@app/redis';
import { STREAM_TAG_PREFIX } from '@app/summary-queue';
import { type PartitionFigures, type QueueFigures, queueFigures, WorkflowRegistry } from '@app/workflows';
import { Gauge, Registry } from 'prom-client';

type Figures = PartitionFigures | QueueFigures;

/** A consumed queue and its figures, read once per scrape for every gauge. */
interface ScrapedQueue {
  readonly name: string;
  readonly figures: () => Promise<QueueFigures>;
}

/**
 * Queue depth, read from Redis at scrape time: what to alert on when it only
 * grows. Every queue the worker consumes (the engine's WorkflowRegistry:
 * summaries, the shared workflows queue, any queue a workflow names for
 * itself) has its gauges with a `queue` label. Each queue is read on its own
 * (one pipelined round trip per partition, once for all the gauges), so a
 * queue whose read fails keeps its last figures and the others still move.
 * The first gauges, summaries' alone without that label, keep their names
 * (alerts, dashboards and autoscalers read them); summaries' per-partition
 * figures are those `jobs_*_partition_*` series only, not again under
 * `queue_*_partition_*`. Totals and each partition's figures are separate
 * gauges (a `partition` label), so a `sum()` over either never counts a job
 * twice.
 */
@Injectable()
export class QueueGauges {
  private readonly logger = new Logger(QueueGauges.name);

  constructor(registry: Registry, workflows: WorkflowRegistry, @InjectRedis() redis: RedisClient) {
    const queues: ScrapedQueue[] = workflows.queues.map((q) => ({
      name: q.name,
      figures: scrapeOnce<QueueFigures>(
        () => queueFigures(redis, q.layout, q.group),
        {
          length: 0,
          pending: 0,
          deadLetters: 0,
          partitions: q.layout.partitions.map((p) => ({ partition: p.index, length: 0, pending: 0, deadLetters: 0 })),
        },
        (err) =>
          this.logger.warn(
            `queue ${q.name}'s gauges not refreshed: ${err instanceof Error ? err.message : String(err)}`,
          ),
      ),
    }));
    const summaries = queues.find((q) => q.name === STREAM_TAG_PREFIX);
    const gauge = (name: string, help: string, pick: (f: Figures) => number) => {
      const partitionName = (prefix: string) => name.replace(/^jobs_(stream|dead_letter)_/, `${prefix}_$1_partition_`);
      // Summaries', as they always were.
      if (summaries) {
        new Gauge({
          name,
          help,
          registers: [registry],
          async collect() {
            this.set(pick(await summaries.figures()));
          },
        });
        new Gauge({
          name: partitionName('jobs'),
          help: `${help}, by partition (JOB_STREAM_PARTITIONS)`,
          labelNames: ['partition'],
          registers: [registry],
          async collect() {
            for (const f of (await summaries.figures()).partitions)
              this.set({ partition: String(f.partition) }, pick(f));
          },
        });
      }
      // Every queue's.
      new Gauge({
        name: name.replace(/^jobs_/, 'queue_'),
        help: `${help}, by queue`,
        labelNames: ['queue'],
        registers: [registry],
        async collect() {
          const all = await Promise.all(queues.map(async (q) => ({ queue: q.name, f: await q.figures() })));
          for (const { queue, f } of all) this.set({ queue }, pick(f));
        },
      });
      const others = queues.filter((q) => q !== summaries);
      new Gauge({
        name: partitionName('queue'),
        help: `${help}, by queue and partition (summaries': the jobs_ series)`,
        labelNames: ['queue', 'partition'],
        registers: [registry],
        async collect() {
          const all = await Promise.all(others.map(async (q) => ({ queue: q.name, f: await q.figures() })));
          for (const { queue, f } of all)
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
