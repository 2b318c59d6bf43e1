import { env } from '@app/config';
import { partitionTags } from '@app/redis';

/** What every partition's hash tag starts with; with one partition it is the whole tag (`{summaries}:jobs`). */
export const STREAM_TAG_PREFIX = 'summaries';

/**
 * The most partitions JOB_STREAM_PARTITIONS allows. Each worker process holds
 * one blocking connection per partition, so partitions times worker pods is
 * connections, and Redis refuses clients past `maxclients` (10000 by default):
 * 1024 still leaves room for several workers. More partitions than a
 * cluster's masters (a cluster is meant for up to about 1000) spreads nothing further.
 */
export const JOB_STREAM_PARTITIONS_MAX = 1024;

/** JOB_STREAM_PARTITIONS, for the schemas of every app that reads or mends the job stream (api, worker, admin). */
export const jobStreamPartitionsEnv = {
  jobStreamPartitions: env.int(
    'JOB_STREAM_PARTITIONS',
    1,
    { min: 1, max: JOB_STREAM_PARTITIONS_MAX },
    {
      describe:
        'job streams, 1 to 1024 (each worker holds a blocking Redis connection per partition); a job goes to ' +
        'the one its id names; 1 keeps the single `{summaries}:jobs`. Every app must have the same value, and ' +
        'changing it needs the old partitions drained first (see "Job stream partitions")',
    },
  ),
};

/** One partition of the job stream: the keys that live under its hash tag, so a script or MULTI may touch them all. */
export interface StreamPartition {
  readonly index: number;
  /** The text between the braces: what puts every key below on one cluster slot. */
  readonly tag: string;
  readonly jobs: string;
  readonly dead: string;
  /** Re-drives counted by the re-drive script itself, in the partition's slot. */
  readonly adminActions: string;
  jobRecordKey(jobId: string): string;
}

/**
 * The partition a job id belongs to: its first 8 hex digits as an unsigned
 * 32-bit number, modulo the partition count. Stable (a job's id never
 * changes, so neither does its partition, for a given count) and uniform: job
 * ids are v5 UUIDs, whose leading bits are SHA-1 output.
 */
export function partitionOf(jobId: string, count: number): number {
  if (!/^[0-9a-f]{8}/i.test(jobId)) throw new RangeError('partitionOf needs a UUID');
  return Number.parseInt(jobId.slice(0, 8).toLowerCase(), 16) % count;
}

function partition(index: number, tag: string): StreamPartition {
  const braced = `{${tag}}`;
  return {
    index,
    tag,
    jobs: `${braced}:jobs`,
    dead: `${braced}:dead`,
    adminActions: `${braced}:admin_actions`,
    jobRecordKey: (jobId) => `${braced}:job:${jobId}`,
  };
}

/**
 * The job stream's layout for JOB_STREAM_PARTITIONS: partition i's keys under
 * `partitionTags('summaries', count)[i]`, which keeps today's names for one
 * partition and spreads the partitions over a cluster's masters otherwise.
 * Every app builds it from the same count (SummaryQueueModule.forRoot).
 */
export class SummaryStreams {
  readonly partitions: readonly StreamPartition[];

  constructor(readonly count = 1) {
    this.partitions = partitionTags(STREAM_TAG_PREFIX, count).map((tag, i) => partition(i, tag));
  }

  /** The partition of job `jobId` (a UUID, any case). */
  of(jobId: string): StreamPartition {
    return this.partitions[partitionOf(jobId.toLowerCase(), this.count)];
  }

  /** Partition `index`, or undefined when there is no such partition. */
  at(index: number): StreamPartition | undefined {
    return this.partitions[index];
  }
}

/** The layout of one partition, today's keys: what a caller gets that did not configure SummaryQueueModule. */
export const SINGLE_STREAM = new SummaryStreams(1);
