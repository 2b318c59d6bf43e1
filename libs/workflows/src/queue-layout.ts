import { partitionTags } from '@app/redis';

/**
 * One partition of a queue: the keys that live under its hash tag, so a
 * script or MULTI may touch them all (the step entries, their dead letters,
 * the run records, the operators' counts).
 */
export interface QueuePartition {
  readonly index: number;
  /** The text between the braces: what puts every key below on one cluster slot. */
  readonly tag: string;
  /** The stream of step entries. */
  readonly jobs: string;
  /** Its dead letters. */
  readonly dead: string;
  /** Re-drives counted by the re-drive script itself, in the partition's slot. */
  readonly adminActions: string;
  /** A run's record (tenant, accepted_at, and status/error once dead-lettered), by run id. */
  jobRecordKey(runId: string): string;
}

/**
 * The partition a run id belongs to: its first 8 hex digits as an unsigned
 * 32-bit number, modulo the partition count. Stable (a run's id never
 * changes, so neither does its partition, for a given count) and uniform: run
 * ids are v5 UUIDs, whose leading bits are SHA-1 output.
 */
export function partitionOf(runId: string, count: number): number {
  if (!/^[0-9a-f]{8}/i.test(runId)) throw new RangeError('partitionOf needs a UUID');
  return Number.parseInt(runId.slice(0, 8).toLowerCase(), 16) % count;
}

function partition(index: number, tag: string): QueuePartition {
  const braced = `{${tag}}`;
  return {
    index,
    tag,
    jobs: `${braced}:jobs`,
    dead: `${braced}:dead`,
    adminActions: `${braced}:admin_actions`,
    jobRecordKey: (runId) => `${braced}:job:${runId}`,
  };
}

/**
 * A queue's keys for JOB_STREAM_PARTITIONS: partition i's keys under
 * `partitionTags(prefix, count)[i]`, which is `{<prefix>}:…` itself for one
 * partition and spreads the partitions over a cluster's masters otherwise.
 * The summaries queue is `new QueueLayout('summaries', n)`: with one
 * partition, `{summaries}:jobs`, `{summaries}:dead`, `{summaries}:job:<id>`.
 * Every app builds a queue's layout from the same count.
 */
export class QueueLayout {
  readonly partitions: readonly QueuePartition[];

  constructor(
    readonly prefix: string,
    readonly count = 1,
  ) {
    this.partitions = partitionTags(prefix, count).map((tag, i) => partition(i, tag));
  }

  /** The partition of run `runId` (a UUID, any case). */
  of(runId: string): QueuePartition {
    return this.partitions[partitionOf(runId.toLowerCase(), this.count)];
  }

  /** Partition `index`, or undefined when there is no such partition. */
  at(index: number): QueuePartition | undefined {
    return this.partitions[index];
  }
}
