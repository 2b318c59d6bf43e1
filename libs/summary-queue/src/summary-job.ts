// The ids and the records' lifetime belong to the workflows' client, which starts summaries jobs too; kept
// importable from here for the code that always did.
export { jobIdFor, JOB_RECORD_TTL_MS } from '@app/workflows';

/**
 * The names with one partition (JOB_STREAM_PARTITIONS=1), which are also
 * partition 0's then: the stream, its dead letters and the job records share
 * one hash slot. With several partitions each has its own (SummaryStreams).
 */
export const JOBS_STREAM = '{summaries}:jobs';
export const DEAD_LETTER_STREAM = '{summaries}:dead';
export const CONSUMER_GROUP = 'summarizers';
export const jobRecordKey = (jobId: string): string => `{summaries}:job:${jobId}`;
/**
 * What operators changed, counted for the whole system whichever tool did it
 * (the admin API or a short-lived CLI no Prometheus scrapes): a hash with the
 * fields `redrive` and `requeue`. Re-drives are counted by the re-drive script
 * in its partition's own `{<tag>}:admin_actions` (with one partition, this
 * key); the figure is the sum over these keys.
 */
export const ADMIN_ACTIONS_KEY = '{summaries}:admin_actions';

export interface SummaryJobPayload {
  readonly text: string;
  readonly notify: string;
}

export interface SummaryJob {
  readonly jobId: string;
  readonly tenant: string;
  readonly payload: SummaryJobPayload;
}

/** A stream entry's flat field list (`[k1, v1, k2, v2, ...]`) as a map: the engine's reader, under its old name. */
export { entryFieldMap as fieldsOf } from '@app/workflows';
