import { decideDurableWrite, type DurableWriteDecision, type DurableWriteFacts } from './durable-write-decision';
import { MasterReplicas } from './master-replicas';
import type { Durability } from './redis-script';

const durable: DurableWriteDecision = { outcome: 'durable' };
const unreplicated: DurableWriteDecision = { outcome: 'unreplicated' };
const refused = (reason: string) => ({ outcome: 'refused', reason });

describe('decideDurableWrite', () => {
  // wanted, mode, WAIT's count, the replicas the master lists online (ROLE) → decision
  const table: [DurableWriteFacts['mode'], DurableWriteFacts['acknowledged'], number | undefined, object][] = [
    // A replica confirmed: durable, whatever else is known.
    ['replica', 1, 1, durable],
    ['strict', 1, 1, durable],
    ['strict', 2, undefined, durable],
    // A master with a replica online that did not confirm (lagging, or cut off and not yet dropped): refused in both.
    ['replica', 0, 1, refused('not-confirmed')],
    ['strict', 0, 1, refused('not-confirmed')],
    // A master with no replica online (a failover left it alone): the mode decides.
    ['replica', 0, 0, unreplicated],
    ['strict', 0, 0, refused('no-replica')],
    // Known to have none, written without WAIT: the same, on what ROLE says now.
    ['replica', 'not-sent', 0, unreplicated],
    ['strict', 'not-sent', 0, refused('no-replica')],
    // ... and one is back: this write did not wait for it.
    ['replica', 'not-sent', 1, refused('replica-returned')],
    // Nothing says the write is safe: WAIT failed, or the master's replicas are unknown (ROLE failed or denied).
    ['replica', 'failed', 0, refused('unknown')],
    ['replica', 0, undefined, refused('unknown')],
    ['replica', 'not-sent', undefined, refused('unknown')],
  ];

  it.each(table)('%s, WAIT %s, %s online → %j', (mode, acknowledged, replicasOnline, expected) => {
    expect(decideDurableWrite({ wanted: 1, mode, acknowledged, replicasOnline })).toEqual(expected);
  });
});

describe('Durability', () => {
  it('requires what counts the writes accepted without a replica in replica mode (a type error otherwise)', () => {
    const masters = new MasterReplicas();
    const counted: Durability = { replicas: 1, timeoutMs: 1000, mode: 'replica', masters };
    // @ts-expect-error: replica mode accepts writes without a replica, which must be counted and logged.
    const uncounted: Durability = { replicas: 1, timeoutMs: 1000, mode: 'replica' };
    const strict: Durability = { replicas: 1, timeoutMs: 1000, mode: 'strict' };
    expect([counted.masters, uncounted.mode, strict.masters]).toEqual([masters, 'replica', undefined]);
  });
});
