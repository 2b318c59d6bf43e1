import type { RedisClient } from '@app/redis';
import { Cluster, Redis } from 'ioredis';
import { testRedisUrl } from './infra';
import { startRedisCluster, type RedisCluster } from './redis-cluster';

/*
 * The suites that must hold on one Redis and on a Redis Cluster alike run their
 * body once per backend, with the same assertions: describeOnEachRedis. The
 * cluster (three masters, a replica each) is started for its run only, in
 * beforeAll, and stopped after the body's own afterAll hooks (jest runs them in
 * the order they are declared), so the apps close while it still answers.
 */

export type RedisBackendName = 'one Redis' | 'Redis Cluster';

export interface RedisBackend {
  readonly name: RedisBackendName;
  /**
   * What the harnesses and the spawned apps get, and nothing else: REDIS_URL (this worker's database) or
   * REDIS_CLUSTER_NODES. Read it in a hook or a test: the cluster's nodes are known once its beforeAll ran.
   */
  readonly env: Readonly<Record<string, string>>;
  /**
   * A connected client for the test's own reads and writes: a Redis on this worker's database, or a Cluster
   * client (reads and writes on the slot's master). Disconnect it when done; the run closes any left open.
   */
  client(): Promise<RedisClient>;
  /** Empties the backend: FLUSHDB on this worker's database, or FLUSHALL on every master of the cluster. */
  flush(): Promise<void>;
}

/**
 * The connections to the masters: the client itself on one Redis, one per master on a cluster. For what a
 * command without a key answers per server (CLIENT LIST, SCAN, KEYS), which on a cluster is one node's part.
 */
export function mastersOf(client: RedisClient): Redis[] {
  return client instanceof Cluster ? client.nodes('master') : [client];
}

/** Closes a client unless it is closed already (disconnect() on a closed one arms a timer that keeps jest alive). */
function close(client: RedisClient): void {
  if (client.status !== 'end' && client.status !== 'close') client.disconnect();
}

interface BackendRun extends RedisBackend {
  /** Runs in beforeAll, before the body's hooks. */
  start(): Promise<void>;
  /** Runs in afterAll, after the body's hooks. */
  stop(): Promise<void>;
}

function oneRedis(): BackendRun {
  const opened = new Set<RedisClient>();
  const connect = async (): Promise<Redis> => {
    const redis = new Redis(testRedisUrl(), { lazyConnect: true });
    await redis.connect();
    return redis;
  };
  return {
    name: 'one Redis',
    env: { REDIS_URL: testRedisUrl() },
    async client() {
      const redis = await connect();
      opened.add(redis);
      return redis;
    },
    async flush() {
      const redis = await connect();
      try {
        await redis.flushdb();
      } finally {
        redis.disconnect();
      }
    },
    async start() {},
    async stop() {
      for (const client of opened) close(client);
    },
  };
}

function redisCluster(): BackendRun {
  const opened = new Set<RedisClient>();
  let cluster: RedisCluster | undefined;
  const started = (): RedisCluster => {
    if (cluster === undefined)
      throw new Error('the Redis Cluster starts in beforeAll: use the backend in a hook or test');
    return cluster;
  };
  return {
    name: 'Redis Cluster',
    get env() {
      return { REDIS_CLUSTER_NODES: started().seedNodesEnv };
    },
    async client() {
      const client = new Cluster([...started().seedNodes], {
        lazyConnect: true,
        scaleReads: 'master',
        redisOptions: { disconnectTimeout: 100 },
      });
      client.on('error', () => undefined);
      opened.add(client);
      await client.connect();
      return client;
    },
    flush: () => started().flushAll(),
    async start() {
      cluster = await startRedisCluster();
    },
    async stop() {
      for (const client of opened) close(client);
      await cluster?.stop();
    },
  };
}

/** `describe(title)` once on one Redis and once on a local Redis Cluster; `body` declares the same tests for both. */
export function describeOnEachRedis(title: string, body: (backend: RedisBackend) => void): void {
  for (const run of [oneRedis(), redisCluster()]) {
    describe(`${title}, on ${run.name}`, () => {
      beforeAll(() => run.start(), 60_000);
      body(run);
      afterAll(() => run.stop());
    });
  }
}
