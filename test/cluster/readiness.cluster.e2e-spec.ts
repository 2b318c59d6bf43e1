import request from 'supertest';
import { startApi, type ApiHarness } from '../support/api-harness';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * Readiness on a cluster: 200 while the cluster answers, 503 naming the
 * Redis check once no master can be reached (the cluster's processes gone),
 * and 200 again is not asked of it here: that cluster does not come back.
 */
describe('/health/ready on a Redis Cluster', () => {
  let redisCluster: RedisCluster;
  let api: ApiHarness;

  beforeAll(async () => {
    redisCluster = await startRedisCluster();
    api = await startApi({ env: { REDIS_CLUSTER_NODES: redisCluster.seedNodesEnv } });
  }, 60_000);

  afterAll(async () => {
    await api?.close();
    await redisCluster?.stop();
  });

  it('is 200 while the cluster answers, and 503 with the Redis check down once every master is gone', async () => {
    const ready = await request(api.server).get('/health/ready').expect(200);
    expect(ready.body).toMatchObject({ status: 'ok', info: { redis: { status: 'up' } } });

    await redisCluster.stop();
    const started = Date.now();
    const down = await request(api.server).get('/health/ready').expect(503);
    const tookMs = Date.now() - started;
    console.log(`readiness with every node gone: 503 in ${tookMs} ms`, JSON.stringify(down.body));
    expect(down.body).toMatchObject({
      status: 503,
      failing: ['redis'],
      checks: { redis: { status: 'down' }, postgres: { status: 'up' } },
    });
    // And it stays down while the client keeps looking for the cluster.
    await request(api.server).get('/health/ready').expect(503);
  }, 30_000);
});
