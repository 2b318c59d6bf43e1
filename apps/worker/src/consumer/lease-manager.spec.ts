import type { LoggerService } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { LeaseManager } from './lease-manager';
import { REFRESH } from './stream-scripts';

const options = { stream: 'jobs', group: 'workers', consumer: 'me', refreshIntervalMs: 20 };

function fakeRedis(reply: () => Promise<unknown>): { redis: Redis; calls: unknown[][] } {
  const calls: unknown[][] = [];
  const evalsha = (...args: unknown[]) => {
    calls.push(args);
    return reply();
  };
  return { redis: { evalsha } as unknown as Redis, calls };
}

const logger = (): LoggerService & { warnings: string[] } => {
  const warnings: string[] = [];
  return { warnings, log: () => undefined, error: () => undefined, warn: (m: string) => warnings.push(m) };
};

describe('LeaseManager', () => {
  it('refreshes what is held, as this consumer, and nothing when nothing is held', async () => {
    const { redis, calls } = fakeRedis(async () => 0);
    let held: string[] = [];
    const leases = new LeaseManager(redis, options, () => held, logger());

    await leases.refresh();
    expect(calls).toEqual([]);

    held = ['1-0', '2-0'];
    await leases.refresh();
    expect(calls).toEqual([[REFRESH.sha, 1, 'jobs', 'workers', 'me', '1-0', '2-0']]);
  });

  it('a failed refresh is logged, and the next one tries again', async () => {
    let fail = true;
    const { redis, calls } = fakeRedis(async () => {
      if (fail) throw new Error('connection lost');
      return 1;
    });
    const log = logger();
    const leases = new LeaseManager(redis, options, () => ['1-0'], log);

    await leases.refresh();
    expect(log.warnings).toEqual(['could not refresh in-flight entries: connection lost']);
    fail = false;
    await leases.refresh();
    expect([calls.length, log.warnings.length]).toEqual([2, 1]);
  });

  it('start() refreshes every refreshIntervalMs, once however often it is called, until stop()', async () => {
    const { redis, calls } = fakeRedis(async () => 1);
    const leases = new LeaseManager(redis, options, () => ['1-0'], logger());
    leases.start();
    leases.start();
    await new Promise((r) => setTimeout(r, 110));
    leases.stop();
    const seen = calls.length;
    expect(seen).toBeGreaterThanOrEqual(3);
    expect(seen).toBeLessThanOrEqual(6);
    await new Promise((r) => setTimeout(r, 60));
    expect(calls.length).toBe(seen);
  });
});
