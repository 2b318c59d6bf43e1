import { HealthChecksRegistry } from './health-checks.registry';

describe('HealthChecksRegistry', () => {
  it('reports a loop as stale only once it has been silent longer than its limit', () => {
    let now = 5_000;
    const registry = new HealthChecksRegistry(() => now);
    registry.registerLoop('consumer', 1000);
    now += 1000;
    expect(registry.staleLoops()).toEqual([]);
    now += 1;
    expect(registry.staleLoops()).toEqual([{ name: 'consumer', silentMs: 1001 }]);
    registry.beat('consumer');
    expect(registry.staleLoops()).toEqual([]);
    now += 1000;
    expect(registry.staleLoops()).toEqual([]);
    // A time given is used instead of the clock's.
    expect(registry.staleLoops(now + 500)).toEqual([{ name: 'consumer', silentMs: 1500 }]);
    registry.unregisterLoop('consumer');
    now += 10_000;
    expect(registry.staleLoops()).toEqual([]);
  });
});
