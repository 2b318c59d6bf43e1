import { uuidV5 } from '@app/ids';

/**
 * Fixed for ever: changing it renames every run and every summaries job (a
 * summaries job id is its run id, and the same namespace was theirs first).
 */
const RUN_ID_NAMESPACE = '0d8e9a54-3c1b-5f3e-9a57-6b0f4e2a71c9';

/**
 * The run id (a summaries job's id) of an idempotent operation
 * (`<tenant>:<METHOD>:<path>:<key>`, IdempotencyRequestContext.operation):
 * the same request always names the same run, even when it runs twice.
 */
export function jobIdFor(operation: string): string {
  return uuidV5(operation, RUN_ID_NAMESPACE);
}

/**
 * Run records (and summaries job records) outlive the idempotency records,
 * so GET still answers after replays stop.
 */
export const JOB_RECORD_TTL_MS = 7 * 24 * 3600 * 1000;
