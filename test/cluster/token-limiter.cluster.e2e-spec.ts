import { createRedisClient, keySlot, type RedisClient } from '@app/redis';
import type { Cluster } from 'ioredis';
import { TenantTokenLimiter, tokensKey } from '@app/llm';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * The tenant token limiter's script on a Redis Cluster: one tenant's count
 * and reservations are one hash under its own hash tag, so every reserve and
 * settle is one script on one slot; tenants land on different slots (and
 * masters) and are limited apart.
 */

let redisCluster: RedisCluster;
let client: RedisClient;

beforeAll(async () => {
  redisCluster = await startRedisCluster();
  client = createRedisClient({
    url: 'redis://unused',
    clusterNodes: { nodes: redisCluster.seedNodes, tls: false },
    connectionName: 'token-limiter-cluster',
  });
  client.on('error', () => undefined);
  await client.connect();
}, 60_000);

afterAll(async () => {
  client?.disconnect();
  await redisCluster?.stop();
});

it('reserves, refuses and settles per tenant on a cluster, each tenant on its own slot', async () => {
  const tenants = ['acme', 'globex', 'initech', 'umbrella'];
  // Tenants spread over slots: the limiter must not assume one node.
  expect(new Set(tenants.map((t) => keySlot(tokensKey(t)))).size).toBeGreaterThan(1);
  const limiter = new TenantTokenLimiter(
    client,
    { byTenant: new Map(), others: { tokens: 100, windowMs: 86_400_000, window: '1d' } },
    10_000,
  );
  for (const tenant of tenants) {
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => limiter.reserve(tenant, 30, `${tenant}-${i}`)),
    );
    const reserved = results.filter((r) => r?.outcome === 'reserved');
    // 30 × 3 fits in 100, a fourth does not: concurrency cannot get past the limit.
    expect(reserved).toHaveLength(3);
    for (const r of reserved) if (r?.outcome === 'reserved') await r.settle(5);
    expect(await limiter.used(tenant)).toBe(15);
    expect((await limiter.reserve(tenant, 80, `${tenant}-after`))?.outcome).toBe('reserved');
  }
  const hash = await (client as Cluster).hgetall(tokensKey('acme'));
  expect(hash.used).toBe('15');
});
