/**
 * How retention deletes (the relay's sent outbox rows, the worker's finished
 * workflow runs): a statement of at most `limit` rows, again and again until
 * one comes back short. Small statements keep row locks and WAL bursts short
 * and let several processes delete side by side (each statement's SELECT ...
 * FOR UPDATE SKIP LOCKED); the loop stops early when asked to (a shutdown),
 * with what it deleted so far.
 */
export interface BatchedDeleteOptions {
  readonly limit: number;
  /** Checked after each full batch: true ends the loop. */
  readonly stopped?: () => boolean;
  /** Before each batch: a liveness beat. */
  readonly beforeEach?: () => void;
  /** Between two batches: a pause, so a large backlog goes at a pace the database shrugs off. */
  readonly between?: () => Promise<void>;
}

/** Runs `deleteBatch(limit)` until it deletes fewer than `limit`; returns the rows deleted in all. */
export async function deleteInBatches(
  deleteBatch: (limit: number) => Promise<number>,
  { limit, stopped, beforeEach, between }: BatchedDeleteOptions,
): Promise<number> {
  let total = 0;
  for (;;) {
    beforeEach?.();
    const deleted = await deleteBatch(limit);
    total += deleted;
    if (deleted < limit || stopped?.()) return total;
    await between?.();
  }
}
