import type { RedisClient } from '@app/redis';
import type { QueueLayout, QueuePartition } from '../queue-layout';

export interface StreamFigures {
  /** Entries not yet acknowledged (acknowledged entries are deleted). */
  readonly length: number;
  /** Of those, delivered to a consumer and not yet acknowledged. */
  readonly pending: number;
  readonly deadLetters: number;
}

export interface PartitionFigures extends StreamFigures {
  readonly partition: number;
}

/** The sums over every partition, and each partition's own. */
export interface QueueFigures extends StreamFigures {
  readonly partitions: readonly PartitionFigures[];
}

/**
 * A queue's figures: one pipelined round trip per partition (a pipeline
 * keeps to one hash slot, as a cluster requires), all partitions at once.
 */
export async function queueFigures(redis: RedisClient, layout: QueueLayout, group: string): Promise<QueueFigures> {
  const partitions = await Promise.all(layout.partitions.map((p) => partitionFigures(redis, p, group)));
  const sum = (pick: (f: StreamFigures) => number) => partitions.reduce((n, f) => n + pick(f), 0);
  return {
    length: sum((f) => f.length),
    pending: sum((f) => f.pending),
    deadLetters: sum((f) => f.deadLetters),
    partitions,
  };
}

async function partitionFigures(
  redis: RedisClient,
  partition: QueuePartition,
  group: string,
): Promise<PartitionFigures> {
  const results = await redis
    .pipeline()
    .xlen(partition.jobs)
    .xpending(partition.jobs, group)
    .xlen(partition.dead)
    .exec();
  const value = (i: number): unknown => {
    const [err, v] = results?.[i] ?? [new Error('no reply'), null];
    // No group yet (no worker has started): nothing is pending.
    if (err && i === 1 && err.message.includes('NOGROUP')) return [0];
    if (err) throw err;
    return v;
  };
  return {
    partition: partition.index,
    length: Number(value(0)),
    pending: Number((value(1) as [number])[0]),
    deadLetters: Number(value(2)),
  };
}
