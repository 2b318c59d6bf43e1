/**
 * REDIS_DURABILITY: what a write does when its master has no replica online.
 * - `replica`: it stands, counted (a failover left the shard without a replica; refusing would stop the shard).
 * - `strict`: it is refused, as a write no replica confirmed.
 * Either way, a master that has a replica waits for it.
 */
export const DURABILITY_MODES = ['replica', 'strict'] as const;
export type DurabilityMode = (typeof DURABILITY_MODES)[number];

/**
 * What is known of a durable write once its script ran.
 * - `acknowledged`: WAIT's count; `not-sent` when the master was known to have no replica (no WAIT, which would
 *   block its whole timeout there); `failed` when WAIT got no count (a timeout, a closed connection).
 * - `replicasOnline`: the replicas the master itself lists as online (ROLE, on the same connection right after the
 *   script and WAIT); undefined when that is unknown (ROLE failed, or the node is no master any more).
 */
export interface DurableWriteFacts {
  readonly wanted: number;
  readonly mode: DurabilityMode;
  readonly acknowledged: number | 'not-sent' | 'failed';
  readonly replicasOnline: number | undefined;
}

export type RefusalReason =
  /** The master has a replica online that did not confirm in time: lagging, or cut off and not yet dropped. */
  | 'not-confirmed'
  /** The master has no replica online, and the mode is strict. */
  | 'no-replica'
  /** WAIT got no count, or the master's replicas are unknown: nothing says the write is safe. */
  | 'unknown'
  /** The master was written without WAIT (it had no replica), and now lists one: this write did not wait for it. */
  | 'replica-returned';

export type DurableWriteDecision =
  | { readonly outcome: 'durable' }
  /** Accepted on a master with no replica online (mode `replica`): counted and logged. */
  | { readonly outcome: 'unreplicated' }
  | { readonly outcome: 'refused'; readonly reason: RefusalReason };

/**
 * Whether a write the master made stands. A replica that is online but does not confirm within the timeout is a
 * refusal in both modes: it is the one a failover would promote, without the write. A master with none online has
 * nothing to promote (a replica cut off from it is dropped only after repl-timeout, 60 s by default, while a master
 * cut off from the majority stops taking writes after cluster-node-timeout, 15 s by default): in `replica` mode the
 * write stands, lost only if that master itself is lost before a replica syncs.
 */
export function decideDurableWrite(facts: DurableWriteFacts): DurableWriteDecision {
  const { wanted, mode, acknowledged, replicasOnline } = facts;
  if (typeof acknowledged === 'number' && acknowledged >= wanted) return { outcome: 'durable' };
  if (acknowledged === 'failed' || replicasOnline === undefined) return { outcome: 'refused', reason: 'unknown' };
  if (replicasOnline > 0)
    return { outcome: 'refused', reason: acknowledged === 'not-sent' ? 'replica-returned' : 'not-confirmed' };
  return mode === 'replica' ? { outcome: 'unreplicated' } : { outcome: 'refused', reason: 'no-replica' };
}
