import { RedisIdempotencyStore } from '@app/idempotency';
import { describeIdempotencyStoreContract } from '@app/idempotency/testing/idempotency-store.contract';
import { createRedisClient } from '@app/redis';
import type { Redis } from 'ioredis';
import { freePort, freshRedis, startRedisServer } from '../support/infra';

describeIdempotencyStoreContract('RedisIdempotencyStore', async () => {
  const redis = await freshRedis();
  const store = new RedisIdempotencyStore(redis);
  return {
    store,
    teardown: async () => {
      await store.close();
      redis.disconnect();
    },
  };
});

describe('RedisIdempotencyStore on Redis', () => {
  let redis: Redis;
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  it('keeps records under idem:<key> with the lock TTL, then the result TTL', async () => {
    const store = new RedisIdempotencyStore(redis);
    const key = 'tenant-a:POST:/v1/things:abcdefghijklmnop';
    await store.claim(key, 'tok', 'fp', 30_000);
    expect(await redis.hget(`idem:${key}`, 'state')).toBe('running');
    expect(await redis.pttl(`idem:${key}`)).toBeGreaterThan(29_000);
    await store.complete(key, 'tok', 'fp', { status: 202, headers: {}, body: Buffer.from('{}') }, 86_400_000);
    expect(await redis.hgetall(`idem:${key}`)).toEqual({
      state: 'completed',
      fp: 'fp',
      status: '202',
      headers: '{}',
      body: '{}',
    });
    expect(await redis.pttl(`idem:${key}`)).toBeGreaterThan(86_000_000);
  });

  it('reloads its scripts after SCRIPT FLUSH (a restarted or failed-over server)', async () => {
    const store = new RedisIdempotencyStore(redis);
    await redis.script('FLUSH');
    await expect(store.claim('k:POST:/x:abcdefghijklmnop', 't', 'fp', 1000)).resolves.toEqual({ outcome: 'claimed' });
  });

  it('fails closed: every operation rejects when Redis is gone', async () => {
    const server = await startRedisServer(freePort(1));
    const client = createRedisClient({ url: server.url, connectionName: 'contract-test', commandTimeoutMs: 500 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      const store = new RedisIdempotencyStore(client);
      await expect(store.claim('k:POST:/x:abcdefghijklmnop', 't', 'fp', 1000)).resolves.toEqual({ outcome: 'claimed' });
      await server.stop();
      await expect(store.claim('k:POST:/x:bcdefghijklmnopq', 't', 'fp', 1000)).rejects.toThrow();
      await expect(
        store.complete(
          'k:POST:/x:abcdefghijklmnop',
          't',
          'fp',
          { status: 200, headers: {}, body: Buffer.alloc(0) },
          1000,
        ),
      ).rejects.toThrow();
      await expect(store.release('k:POST:/x:abcdefghijklmnop', 't')).rejects.toThrow();
      await expect(store.renew('k:POST:/x:abcdefghijklmnop', 't', 1000)).rejects.toThrow();
    } finally {
      client.disconnect();
      await server.stop();
    }
  });
});
