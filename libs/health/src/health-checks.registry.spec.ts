import { HealthChecksRegistry } from './health-checks.registry';

describe('HealthChecksRegistry', () => {
  it('reports a loop as stale only once it has been silent longer than its limit', () => {
    const registry = new HealthChecksRegistry();
    const t0 = performance.now();
    registry.registerLoop('consumer', 1000);
    expect(registry.staleLoops(t0 + 900)).toEqual([]);
    expect(registry.staleLoops(t0 + 1500)).toEqual([{ name: 'consumer', silentMs: expect.any(Number) }]);
    registry.beat('consumer');
    expect(registry.staleLoops(performance.now() + 500)).toEqual([]);
    registry.unregisterLoop('consumer');
    expect(registry.staleLoops(performance.now() + 10_000)).toEqual([]);
  });
});
