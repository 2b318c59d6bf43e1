import { Logger } from '@nestjs/common';
import { Registry } from 'prom-client';
import { ReplicaLessMasters } from './replica-less-masters';

describe('ReplicaLessMasters', () => {
  let now = 0;
  let warnings: string[];
  const clock = () => now;

  beforeEach(() => {
    now = 1_000_000;
    warnings = [];
    jest.useFakeTimers({ now });
    jest.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => void warnings.push(String(message)));
  });
  afterEach(() => {
    jest.useRealTimers();
    jest.restoreAllMocks();
  });

  const advance = (ms: number) => {
    now += ms;
    jest.advanceTimersByTime(ms);
  };

  it('remembers a master without a replica for a while, and forgets it once it lists one', () => {
    const masters = new ReplicaLessMasters(undefined, clock);
    masters.observe('a:1', 0);
    masters.observe('b:2', undefined);
    expect(masters.isReplicaLess('a:1')).toBe(true);
    expect(masters.isReplicaLess('b:2')).toBe(false);
    advance(4999);
    expect(masters.isReplicaLess('a:1')).toBe(true);
    advance(1);
    expect(masters.isReplicaLess('a:1')).toBe(false);
    masters.observe('a:1', 0);
    masters.observe('a:1', 1);
    expect(masters.isReplicaLess('a:1')).toBe(false);
  });

  it('counts every write accepted without a replica, and logs them at most once a minute, none left unsaid', async () => {
    const registry = new Registry();
    const masters = new ReplicaLessMasters(registry, clock);
    masters.accepted('a:1');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^1 write\(s\) .* a:1 \(1\)/);
    for (let i = 0; i < 5; i++) masters.accepted('a:1');
    masters.accepted('b:2');
    advance(59_999);
    expect(warnings).toHaveLength(1);
    advance(1);
    expect(warnings).toHaveLength(2);
    expect(warnings[1]).toMatch(/^6 write\(s\) .* a:1 \(5\), b:2 \(1\)/);
    masters.accepted('a:1');
    masters.close();
    expect(warnings).toHaveLength(3);
    masters.accepted('a:1');
    advance(120_000);
    expect(warnings).toHaveLength(3);
    expect(await registry.getSingleMetricAsString('redis_unreplicated_writes_total')).toMatch(
      /^redis_unreplicated_writes_total 9$/m,
    );
  });
});
