import { isUuid } from '@app/ids';
import { type RedisClient, RedisScript } from '@app/redis';
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

/** Sets the wait's fields on a record that exists (a run started by a start; nothing is made without its tenant). */
const NOTE_TOKEN_WAIT = new RedisScript(
  'workflow-token-wait',
  `if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'tokens_wait_step', ARGV[1], 'tokens_wait_until', ARGV[2])
return 1`,
);

/**
 * Notes on a run's record that `step` waits for its tenant's token limit
 * until `untilMs` (epoch ms): GET /v1/runs/<run_id> shows it while it is
 * ahead (run-status.ts). A record that does not exist is not made.
 */
export async function noteTokenWait(redis: RedisClient, key: string, step: string, untilMs: number): Promise<void> {
  await NOTE_TOKEN_WAIT.run(redis, [key], [step, Math.round(untilMs)]);
}
