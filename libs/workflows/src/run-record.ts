import { isUuid } from '@app/ids';
import type { ChainableCommander } from 'ioredis';
import type { QueuePartition } from './queue-layout';
import { JOB_RECORD_TTL_MS } from './run-ids';
import { STEP_ENTRY_FIELDS } from './wire';

/**
 * Adds to a dead-letter MULTI what marks the entry's run failed in its
 * record (`reason` as its error), in `partition`, the one whose stream the
 * entry was in (so the record shares the MULTI's hash slot). An entry without
 * a usable run id or tenant has no record to mark and adds nothing. The same
 * record the start wrote (run-start.ts), kept as long (JOB_RECORD_TTL_MS).
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
  tx.hset(key, 'tenant', tenant, 'status', 'failed', 'error', reason).pexpire(key, JOB_RECORD_TTL_MS);
}
