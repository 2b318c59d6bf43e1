import { RedisIdempotencyStore } from '@app/idempotency';
import { describeIdempotencyStoreContract } from '@app/idempotency/testing/idempotency-store.contract';
import { createRedisClient, NotReplicatedError } from '@app/redis';
import type { Redis } from 'ioredis';
import { freePort, freshRedis, startRedisServer } from '../support/infra';

describeIdempotencyStoreContract('RedisIdempotencyStore', async ({ idleCheckMs }) => {
  const redis = await freshRedis();
  const store = new RedisIdempotencyStore(redis, { idleCheckMs });
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
      by: 'tok',
    });
    expect(await redis.pttl(`idem:${key}`)).toBeGreaterThan(86_000_000);
  });

  // ioredis sends a pipeline again when the connection closed before any reply came, though its script may have run.
  it('a claim and a completion sent twice by the same attempt answer as the first send did, writing nothing twice', async () => {
    const store = new RedisIdempotencyStore(redis);
    const key = 'tenant-a:POST:/v1/things:sent-twice-plain';
    const answer = { status: 202, headers: {}, body: Buffer.from('{"id":1}') };
    await expect(store.claim(key, 'tok', 'fp', 30_000)).resolves.toEqual({ outcome: 'claimed' });
    await expect(store.claim(key, 'tok', 'fp', 30_000)).resolves.toEqual({ outcome: 'claimed' });
    await expect(store.complete(key, 'tok', 'fp', answer, 86_400_000)).resolves.toBe(true);
    const stored = await redis.hgetall(`idem:${key}`);
    await expect(store.complete(key, 'tok', 'fp', answer, 86_400_000)).resolves.toBe(true);
    expect(await redis.hgetall(`idem:${key}`)).toEqual(stored);
    // Another attempt's token, or another fingerprint, is not this completion sent again.
    await expect(store.complete(key, 'other', 'fp', answer, 86_400_000)).resolves.toBe(false);
    await expect(store.complete(key, 'tok', 'fp2', answer, 86_400_000)).resolves.toBe(false);
    await expect(store.complete(key, 'tok', 'fp', { ...answer, body: Buffer.from('{}') }, 86_400_000)).resolves.toBe(
      false,
    );
    expect(await redis.hgetall(`idem:${key}`)).toEqual(stored);
    await expect(store.claim(key, 'other', 'fp', 30_000)).resolves.toMatchObject({ outcome: 'completed' });
  });

  it('a streamed answer completed twice by the same attempt: success both times, one end marker', async () => {
    const store = new RedisIdempotencyStore(redis);
    const key = 'tenant-a:POST:/v1/things:frames-sent-twice';
    await store.claim(key, 'tok', 'fp', 30_000);
    await store.frames.begin(key, 'tok', { status: 200, headers: {} });
    await store.frames.append(key, 'tok', [Buffer.from('data: 1\n\n')]);
    // With its last frames: sent again, it appends them no second time.
    const last = [Buffer.from('data: 2\n\n'), Buffer.from('data: [DONE]\n\n')];
    await expect(store.frames.completeWith(key, 'tok', 'fp', 60_000, last)).resolves.toBe(true);
    const stored = await redis.hgetall(`idem:${key}`);
    await expect(store.frames.completeWith(key, 'tok', 'fp', 60_000, last)).resolves.toBe(true);
    expect(await redis.hgetall(`idem:${key}`)).toEqual(stored);
    const entries = await redis.xrange(stored.frames, '-', '+');
    expect(entries.filter(([, fields]) => fields[0] === 'e')).toHaveLength(1);
    expect(entries.filter(([, fields]) => fields[0] === 'd').map(([, fields]) => fields[1])).toEqual([
      'data: 1\n\n',
      'data: 2\n\n',
      'data: [DONE]\n\n',
    ]);
    await expect(store.frames.complete(key, 'other', 'fp', 60_000)).resolves.toBe(false);
    await store.close();
  });

  it('a durable claim sent twice whose second WAIT no replica confirms is refused and freed, not claimed', async () => {
    const key = 'tenant-a:POST:/v1/things:sent-twice-durable';
    // The first send ran (it is on the master); its replies were lost with the connection.
    await new RedisIdempotencyStore(redis).claim(key, 'tok', 'fp', 30_000);
    const durable = new RedisIdempotencyStore(redis, { durability: { replicas: 1, timeoutMs: 50 } });
    await expect(durable.claim(key, 'tok', 'fp', 30_000)).rejects.toBeInstanceOf(NotReplicatedError);
    expect(await redis.exists(`idem:${key}`)).toBe(0);
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

/*
 * A body that is not UTF-8 (0xff) replayed while its record is replaced: the
 * record expires and another request with the same key and body stores
 * another answer. Timeline: the claim reads A; before any further read of the
 * record (the seam: the client's whole- or part-record read as bytes), A is
 * gone and B stored; the replay is then A whole or B whole, never A's status
 * and headers with B's body. Durable: the claim through runDurably (a
 * pipeline with WAIT, which no replica here confirms: it only read, so it
 * answers).
 */
describe.each([
  ['without durability', undefined],
  ['with durability', { replicas: 1, timeoutMs: 50 }],
])('RedisIdempotencyStore replaying bytes while the record is replaced (%s)', (_name, durability) => {
  let redis: Redis;
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  it('replays one record: its head with its own body', async () => {
    const writer = new RedisIdempotencyStore(redis);
    const store = new RedisIdempotencyStore(redis, { durability });
    const key = 'tenant-a:POST:/v1/things:replaced-between-reads';
    const a = { status: 201, headers: { 'x-answer': 'a' }, body: Buffer.from([0xff, 0x41]) };
    const b = { status: 202, headers: { 'x-answer': 'b' }, body: Buffer.from([0xff, 0x42]) };
    await writer.claim(key, 'tok-a', 'fp', 30_000);
    await writer.complete(key, 'tok-a', 'fp', a, 60_000);

    let swaps = 0;
    const swap = async (): Promise<void> => {
      if (swaps++ > 0) return;
      await redis.del(`idem:${key}`); // A expired
      await writer.claim(key, 'tok-b', 'fp', 30_000);
      await writer.complete(key, 'tok-b', 'fp', b, 60_000);
    };
    const client = redis as unknown as Record<'hmgetBuffer' | 'hgetallBuffer', (...args: unknown[]) => unknown>;
    const reads = { hmgetBuffer: client.hmgetBuffer, hgetallBuffer: client.hgetallBuffer };
    for (const name of ['hmgetBuffer', 'hgetallBuffer'] as const) {
      client[name] = async (...args: unknown[]) => {
        await swap();
        return reads[name].apply(redis, args);
      };
    }
    try {
      const result = await store.claim(key, 'tok-c', 'fp', 30_000);
      expect(result.outcome).toBe('completed');
      const response = result.outcome === 'completed' ? result.response : undefined;
      const replayed = [response?.status, response?.headers, response?.body.toString('hex')];
      expect([
        [a.status, a.headers, a.body.toString('hex')],
        [b.status, b.headers, b.body.toString('hex')],
      ]).toContainEqual(replayed);
    } finally {
      Object.assign(client, reads);
      await writer.close();
      await store.close();
    }
  });
});
