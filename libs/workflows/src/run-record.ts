import { isUuid } from '@app/ids';
import type { ChainableCommander } from 'ioredis';
import type { QueuePartition } from './queue-layout';
import { STEP_ENTRY_FIELDS } from './wire';

/** A run's record outlives the idempotency records, so GET still answers after replays stop. */
export const RUN_RECORD_TTL_MS = 7 * 24 * 3600 * 1000;

/**
 * Adds to a dead-letter MULTI what marks the entry's run failed in its
 * record (`reason` as its error), in `partition`, the one whose stream the
 * entry was in (so the record shares the MULTI's hash slot). An entry without
 * a usable run id or tenant has no record to mark and adds nothing. The same
 * commands as summaries' markSummaryJobFailed: one record shape for both.
 */
export function markRunFailed(
  tx: ChainableCommander,
  partition: QueuePartition,
  fields: Readonly<Record<string, string>>,
  reason: string,
): void {
  const runId = fields[STEP_ENTRY_FIELDS.runId];
  const tenant = fields[STEP_ENTRY_FIELDS.tenant];
  if (!runId || !tenant || !isUuid(runId)) return;
  const key = partition.jobRecordKey(runId);
  tx.hset(key, 'tenant', tenant, 'status', 'failed', 'error', reason).pexpire(key, RUN_RECORD_TTL_MS);
}
