import { env } from '@app/config';
import { partitionOf, type QueuePartition, QueueLayout } from '@app/workflows';

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

/** One partition of the job stream (a queue's partition: libs/workflows owns the layout). */
export type StreamPartition = QueuePartition;

export { partitionOf };

/**
 * The job stream's layout for JOB_STREAM_PARTITIONS: the summaries queue,
 * which keeps today's names for one partition and spreads the partitions
 * over a cluster's masters otherwise. Every app builds it from the same
 * count (SummaryQueueModule.forRoot).
 */
export class SummaryStreams extends QueueLayout {
  constructor(count = 1) {
    super(STREAM_TAG_PREFIX, count);
  }
}

/** The layout of one partition, today's keys: what a caller gets that did not configure SummaryQueueModule. */
export const SINGLE_STREAM = new SummaryStreams(1);
