import type { Attempt } from './attempt';
import { IdempotencyLockLostError, type PendingIdempotencyRecord } from './idempotency-context';
import type { StoredResponse } from './idempotency-store.interface';
import { jsonAnswer } from './settle-decision';

/** The attempt's record as its handler (or recovery) can finalise it, and what came of that. */
export interface PendingRecord {
  readonly record: PendingIdempotencyRecord;
  /** True from the moment the answer is written inside the transaction, until a refusal. */
  readonly completing: boolean;
  /** What was stored, once `completeWithin` returned; the last call's, if the transaction was retried. */
  completed(): StoredResponse | undefined;
}

/**
 * The attempt's record as a handler (or a recovery) finalises it inside its
 * own transaction. `completing` is true from the moment it writes the
 * answer: a renewal may then wait on the transaction's row lock and find
 * the record completed, a refusal that is expected, not a lost lock.
 */
export function pendingRecord(attempt: Attempt): PendingRecord {
  let completing = false;
  let completedWithin: StoredResponse | undefined;
  const { settings, context } = attempt;
  const record: PendingIdempotencyRecord = {
    completeWithin: async (tx, answer) => {
      const store = settings.store;
      if (!store.completeWithin)
        throw new Error(
          "Idempotency: this route's store cannot finalise inside a transaction (use a PostgreSQL store)",
        );
      if (!settings.storesStatus(answer.status))
        throw new Error(
          `Idempotency: a ${answer.status} answer is not stored on this route; finalise only answers it stores`,
        );
      const stored = jsonAnswer(answer, settings.replayHeaders);
      if (stored.body.length > settings.maxStoredBodyBytes)
        throw new Error("Idempotency: the answer is over the route's maxStoredBodyBytes");
      completing = true;
      const ours = await store.completeWithin(
        tx,
        context.operation,
        attempt.token,
        context.fingerprint,
        stored,
        settings.resultTtlMs,
      );
      // Refused: another request holds the key now. Throwing rolls the effect back with it.
      if (!ours) {
        completing = false;
        throw new IdempotencyLockLostError();
      }
      // May be called again if the transaction is retried: the last call is the answer.
      completedWithin = stored;
    },
  };
  return {
    record,
    get completing() {
      return completing;
    },
    completed: () => completedWithin,
  };
}
