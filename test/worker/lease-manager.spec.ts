import type { LoggerService } from '@nestjs/common';
import { Redis } from 'ioredis';
import { LeaseManager } from '../../libs/workflows/src/consumer/lease-manager';
import { eventually, freshRedis } from '../support/infra';
import { idlePast, pendingIdle } from '../support/pending-entries';

const options = { stream: 'lease-test:jobs', group: 'workers', consumer: 'me', refreshIntervalMs: 20 };

const logger = (): LoggerService & { warnings: string[] } => {
  const warnings: string[] = [];
  return { warnings, log: () => undefined, error: () => undefined, warn: (m: string) => warnings.push(m) };
};

/** Each entry's idle ms in the group's pending list, by id. */
const idleOf = (redis: Redis) => pendingIdle(redis, options.stream, options.group);
/** Waits until every pending entry has been idle at least `ms`; their idle times then. */
const agedPast = (redis: Redis, ms: number) => idlePast(redis, options.stream, options.group, ms);

describe('LeaseManager against Redis', () => {
  let redis: Redis;
  let ids: string[];

  beforeEach(async () => {
    redis = await freshRedis();
    await redis.xgroup('CREATE', options.stream, options.group, '$', 'MKSTREAM');
    ids = [(await redis.xadd(options.stream, '*', 'n', '1'))!, (await redis.xadd(options.stream, '*', 'n', '2'))!];
    await redis.xreadgroup('GROUP', options.group, options.consumer, 'COUNT', 10, 'STREAMS', options.stream, '>');
  });
  afterEach(() => redis.quit());

  it('resets the idle time of the entries it holds, and only theirs', async () => {
    const leases = new LeaseManager(redis, options, () => [ids[0]], logger());
    const aged = await agedPast(redis, 100);
    await leases.refresh();
    const idle = await idleOf(redis);
    // The held entry was just claimed again; the other has aged since it was read, the refresh did not touch it.
    expect(idle.get(ids[0])!).toBeLessThan(idle.get(ids[1])!);
    expect(idle.get(ids[1])!).toBeGreaterThanOrEqual(aged.get(ids[1])!);
  });

  it('asks nothing of Redis when nothing is held', async () => {
    const before = Number((await redis.info('stats')).match(/total_commands_processed:(\d+)/)![1]);
    await new LeaseManager(redis, options, () => [], logger()).refresh();
    const after = Number((await redis.info('stats')).match(/total_commands_processed:(\d+)/)![1]);
    // The second INFO itself is the only command in between.
    expect(after - before).toBe(1);
  });

  it('logs a refresh Redis did not answer, and the next one on a live connection goes through', async () => {
    const down = new Redis({
      port: 1,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      enableOfflineQueue: false,
      retryStrategy: () => null,
    });
    const log = logger();
    await new LeaseManager(down, options, () => [ids[0]], log).refresh();
    expect(log.warnings).toHaveLength(1);
    expect(log.warnings[0]).toMatch(/^could not refresh in-flight entries: /);
    down.disconnect();

    await agedPast(redis, 100);
    await new LeaseManager(redis, options, () => [ids[0]], log).refresh();
    const idle = await idleOf(redis);
    expect(idle.get(ids[0])!).toBeLessThan(idle.get(ids[1])!);
    expect(log.warnings).toHaveLength(1);
  });

  it('start() refreshes on its interval, once however often it is called, until stop()', async () => {
    let refreshes = 0;
    const leases = new LeaseManager(
      redis,
      options,
      () => {
        refreshes++;
        return [ids[0]];
      },
      logger(),
    );
    leases.start();
    leases.start();
    await eventually(() => (refreshes >= 3 ? true : undefined), 5000, 'three refreshes');
    leases.stop();
    const seen = refreshes;
    // The moment has passed once another manager on the same interval, started after stop(), has refreshed three
    // times: a timer stop() left running, due before it, would have fired in between.
    let later = 0;
    const clock = new LeaseManager(
      redis,
      options,
      () => {
        later++;
        return [];
      },
      logger(),
    );
    clock.start();
    try {
      await eventually(() => (later >= 3 ? true : undefined), 5000, "the later manager's three refreshes");
    } finally {
      clock.stop();
    }
    expect(refreshes).toBe(seen);
  });
});
