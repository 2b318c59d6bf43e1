import { RedisIdempotencyStore } from '@app/idempotency';
import { NotReplicatedError } from '@app/redis';
import type { Redis } from 'ioredis';
import { freshRedis } from '../support/infra';

/*
 * RedisIdempotencyStore with a durability this Redis (no replica) can never
 * meet: what a claim and a stored answer do when no replica confirms them.
 */
describe('RedisIdempotencyStore when no replica confirms a write', () => {
  let redis: Redis;
  const durability = { replicas: 1, timeoutMs: 50 };
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  it('a claim fails with NotReplicatedError and leaves no record (a retry may claim at once)', async () => {
    const store = new RedisIdempotencyStore(redis, { durability });
    const key = 'tenant-a:POST:/v1/things:claim-not-replicated';
    await expect(store.claim(key, 'tok', 'fp', 30_000)).rejects.toBeInstanceOf(NotReplicatedError);
    expect(await redis.exists(`idem:${key}`)).toBe(0);
    await store.close();
  });

  it('a claim that only read (the key is held) answers as usual: nothing of its own to lose', async () => {
    const plain = new RedisIdempotencyStore(redis);
    const store = new RedisIdempotencyStore(redis, { durability });
    const key = 'tenant-a:POST:/v1/things:held';
    await expect(plain.claim(key, 'first', 'fp', 30_000)).resolves.toEqual({ outcome: 'claimed' });
    await expect(store.claim(key, 'second', 'fp', 30_000)).resolves.toMatchObject({ outcome: 'in-progress' });
    expect(await redis.hget(`idem:${key}`, 'token')).toBe('first');
    await plain.close();
    await store.close();
  });

  it('a stored answer stands on the master: complete() is true and the record is completed', async () => {
    const plain = new RedisIdempotencyStore(redis);
    const store = new RedisIdempotencyStore(redis, { durability });
    const key = 'tenant-a:POST:/v1/things:complete-not-replicated';
    await plain.claim(key, 'tok', 'fp', 30_000);
    const answer = { status: 202, headers: { 'content-type': 'application/json' }, body: Buffer.from('{}') };
    await expect(store.complete(key, 'tok', 'fp', answer, 60_000)).resolves.toBe(true);
    expect(await redis.hget(`idem:${key}`, 'state')).toBe('completed');
    // A wrong token is still refused.
    await plain.claim(`${key}:2`, 'tok', 'fp', 30_000);
    await expect(store.complete(`${key}:2`, 'other', 'fp', answer, 60_000)).resolves.toBe(false);
    await plain.close();
    await store.close();
  });
});
