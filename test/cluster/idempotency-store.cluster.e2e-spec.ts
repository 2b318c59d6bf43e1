import { RedisIdempotencyStore } from '@app/idempotency';
import { describeIdempotencyStoreContract } from '@app/idempotency/testing/idempotency-store.contract';
import { createRedisClient, hashTagFor, keySlot, type RedisClient } from '@app/redis';
import { JOBS_STREAM } from '@app/summary-queue';
import { randomUUID } from 'node:crypto';
import { Cluster } from 'ioredis';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * The idempotency store's contract on a Redis Cluster, as on one Redis
 * (test/idempotency/redis-idempotency.store.spec.ts): every script keeps its
 * keys in one slot, and followers of requests on different slots and masters
 * are woken as they would be on one Redis.
 */

let redisCluster: RedisCluster;
const clients: RedisClient[] = [];

const clusterClient = async (): Promise<Cluster> => {
  const client = createRedisClient({
    url: 'redis://unused',
    clusterNodes: { nodes: redisCluster.seedNodes, tls: false },
    connectionName: 'contract-cluster',
  });
  client.on('error', () => undefined);
  clients.push(client);
  await client.connect();
  return client as Cluster;
};

beforeAll(async () => {
  redisCluster = await startRedisCluster();
}, 60_000);

afterAll(async () => {
  for (const client of clients) client.disconnect();
  await redisCluster?.stop();
});

describeIdempotencyStoreContract('RedisIdempotencyStore on a Redis Cluster', async ({ idleCheckMs }) => {
  const store = new RedisIdempotencyStore(await clusterClient(), { idleCheckMs });
  return { store, teardown: () => store.close() };
});

// As the api runs on a cluster (REDIS_DURABILITY): claims and answers through the pipeline with WAIT, whose replies
// are text, so a replayed body that is not UTF-8 is read again as bytes.
describeIdempotencyStoreContract(
  'RedisIdempotencyStore on a Redis Cluster, waiting for a replica',
  async ({ idleCheckMs }) => {
    const store = new RedisIdempotencyStore(await clusterClient(), {
      idleCheckMs,
      durability: { replicas: 1, timeoutMs: 5000 },
    });
    return { store, teardown: () => store.close() };
  },
);

describe('RedisIdempotencyStore on a Redis Cluster', () => {
  it('spreads records over the masters, each frames stream beside its record', async () => {
    const redis = await clusterClient();
    const store = new RedisIdempotencyStore(redis);
    try {
      const keys = Array.from({ length: 12 }, (_, i) => `tenant-a:POST:/v1/things:spread-${i}-abcdefghijkl`);
      for (const k of keys) {
        await store.claim(k, 'tok', 'fp', 30_000);
        await store.frames.begin(k, 'tok', { status: 200, headers: {} });
      }
      const owners = new Set<number>();
      for (const k of keys) {
        const slot = Number(await redis.cluster('KEYSLOT', `idem:${k}`));
        expect(await redis.cluster('KEYSLOT', `{idem:${k}}:f:tok`)).toBe(slot);
        const port = await redisCluster.masterOf(slot);
        expect(await redisCluster.command(port, 'EXISTS', `idem:${k}`, `{idem:${k}}:f:tok`)).toBe(2);
        owners.add(port);
      }
      expect(owners.size).toBe(3);
    } finally {
      await store.close();
    }
  });

  /** Every key on the cluster's masters that matches `pattern` (KEYS: the test cluster holds a few hundred). */
  async function keysMatching(pattern: string): Promise<string[]> {
    const found: string[] = [];
    for (const master of await redisCluster.masters())
      found.push(...((await redisCluster.command(master.port, 'KEYS', pattern)) as string[]));
    return found;
  }

  it('a client key with braces of its own does not choose the record’s slot, and its record still works', async () => {
    const redis = await clusterClient();
    const store = new RedisIdempotencyStore(redis, { idleCheckMs: 500 });
    const streamSlot = keySlot(JOBS_STREAM);
    try {
      // Drawn again in the 1 in 16384 case the record's own tag lands in the slot it must not share.
      const avoiding = (make: () => string): string => {
        for (;;) {
          const clientKey = make();
          const tag = /\{([^}]+)\}/.exec(clientKey)?.[1];
          const recordSlot = keySlot(hashTagFor(`idem:tenant-a:POST:/v1/summaries:${clientKey}`));
          if (recordSlot !== streamSlot && (tag === undefined || recordSlot !== keySlot(tag))) return clientKey;
        }
      };
      for (const clientKey of [
        avoiding(() => `{summaries}-${randomUUID()}`),
        avoiding(() => `a}b-${randomUUID()}`),
        avoiding(() => `}{x}-${randomUUID()}`),
      ]) {
        const k = `tenant-a:POST:/v1/summaries:${clientKey}`;
        const clientTag = /\{([^}]+)\}/.exec(k)?.[1];
        expect(await store.claim(k, 't1', 'fp', 30_000)).toEqual({ outcome: 'claimed' });
        await store.frames.begin(k, 't1', { status: 200, headers: { 'content-type': 'text/event-stream' } });
        const named = await keysMatching(`*${clientKey.slice(-36)}*`);
        const [record, ...others] = [
          ...named.filter((n) => n.startsWith('idem:')),
          ...named.filter((n) => !n.startsWith('idem:')),
        ];
        const slot = Number(await redis.cluster('KEYSLOT', record));
        if (clientTag !== undefined) expect(slot).not.toBe(keySlot(clientTag));
        expect(slot).not.toBe(streamSlot);
        // Its frames are the one other key naming it, in the same slot.
        expect(others).toHaveLength(1);
        expect(Number(await redis.cluster('KEYSLOT', others[0]))).toBe(slot);

        // A second caller attaches to the running request, follows its frames to the end, and the record replays.
        const running = await store.claim(k, 't2', 'fp', 30_000);
        if (running.outcome !== 'in-progress' || !running.frames) throw new Error('expected a running record');
        const events: string[] = [];
        const followed = (async () => {
          for await (const e of store.frames.follow(running.frames!, new AbortController().signal)) events.push(e.kind);
        })();
        await store.frames.append(k, 't1', ['data: 1\n\n']);
        expect(await store.frames.complete(k, 't1', 'fp', 60_000)).toBe(true);
        await followed;
        expect(events).toEqual(['head', 'frame', 'end']);
        const replay = await store.claim(k, 't3', 'fp', 30_000);
        expect(replay).toMatchObject({ outcome: 'completed', fingerprint: 'fp', response: { status: 200 } });
      }
    } finally {
      await store.close();
    }
  });

  it('a follower keeps following across a manual failover of its master', async () => {
    const redis = await clusterClient();
    const store = new RedisIdempotencyStore(redis, { idleCheckMs: 500 });
    try {
      const k = 'tenant-a:POST:/v1/things:failover-abcdefghijkl';
      await store.claim(k, 't1', 'fp', 30_000);
      await store.frames.begin(k, 't1', { status: 200, headers: {} });
      const claim = await store.claim(k, 't2', 'fp', 30_000);
      if (claim.outcome !== 'in-progress' || !claim.frames) throw new Error('expected a running record with frames');
      const events: string[] = [];
      const stop = new AbortController();
      const followed = (async () => {
        for await (const event of store.frames.follow(claim.frames!, stop.signal)) events.push(event.kind);
      })();
      await store.frames.append(k, 't1', ['data: 1\n\n']);
      const master = await redisCluster.masterOf(Number(await redis.cluster('KEYSLOT', `idem:${k}`)));
      const result = await redisCluster.failover(master);
      console.log(`failover under a follower: ${result.from} -> ${result.to} in ${result.ms} ms`);
      await store.frames.append(k, 't1', ['data: 2\n\n']);
      await store.frames.complete(k, 't1', 'fp', 60_000);
      const timer = setTimeout(() => stop.abort(), 10_000);
      await followed;
      clearTimeout(timer);
      expect(stop.signal.aborted).toBe(false);
      expect(events).toEqual(['head', 'frame', 'frame', 'end']);
    } finally {
      await store.close();
    }
  }, 60_000);
});
