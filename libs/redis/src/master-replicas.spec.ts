import { Logger } from '@nestjs/common';
import { Registry } from 'prom-client';
import { MasterReplicas } from './master-replicas';

describe('MasterReplicas', () => {
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

  it('knows for a while whether a master has replicas, from what its writes found', () => {
    const masters = new MasterReplicas(undefined, clock);
    masters.observe('a:1', 0);
    masters.observe('b:2', 2);
    masters.observe('c:3', undefined);
    expect([masters.replicasOf('a:1'), masters.replicasOf('b:2'), masters.replicasOf('c:3')]).toEqual([
      'none',
      'some',
      undefined,
    ]);
    advance(4999);
    expect(masters.replicasOf('a:1')).toBe('none');
    advance(1);
    expect(masters.replicasOf('a:1')).toBeUndefined();
    masters.observe('a:1', 0);
    masters.observe('a:1', 1);
    expect(masters.replicasOf('a:1')).toBe('some');
  });

  it('a master that denies ROLE is unknown for a while, not unasked, and the warning is given once', () => {
    const masters = new MasterReplicas(undefined, clock);
    masters.roleDenied('a:1');
    masters.roleDenied('b:2');
    expect([masters.replicasOf('a:1'), masters.replicasOf('b:2')]).toEqual(['unknown', 'unknown']);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/denied ROLE on a:1.*\+role/);
    advance(5000);
    expect(masters.replicasOf('a:1')).toBeUndefined();
    masters.roleDenied('a:1');
    expect(warnings).toHaveLength(1);
  });

  it('lets one write find out what a master has, the others waiting for it, failed or not', async () => {
    const masters = new MasterReplicas(undefined, clock);
    expect(masters.learning('a:1')).toBeUndefined();
    let fail!: (err: Error) => void;
    const first = new Promise((_, reject) => (fail = reject));
    masters.learnFrom('a:1', first);
    masters.learnFrom('a:1', Promise.resolve());
    const waiting = masters.learning('a:1');
    expect(waiting).toBeDefined();
    let settled = false;
    void waiting!.then(() => (settled = true));
    await Promise.resolve();
    expect(settled).toBe(false);
    fail(new Error('timed out'));
    await waiting;
    await Promise.resolve();
    expect(masters.learning('a:1')).toBeUndefined();
  });

  it('counts every write accepted without a replica, and logs them at most once a minute, none left unsaid', async () => {
    const registry = new Registry();
    const masters = new MasterReplicas(registry, clock);
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
