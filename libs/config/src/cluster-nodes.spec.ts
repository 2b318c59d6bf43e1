import { commonEnv, parseConfig } from './env-schema';

const nodesOf = (value: string | undefined) =>
  parseConfig({ redisClusterNodes: commonEnv.redisClusterNodes }, { REDIS_CLUSTER_NODES: value }).redisClusterNodes;

describe('REDIS_CLUSTER_NODES', () => {
  it('unset or empty: no cluster', () => {
    expect(nodesOf(undefined)).toBeUndefined();
    expect(nodesOf('')).toBeUndefined();
    expect(nodesOf('  ')).toBeUndefined();
  });

  it('host:port pairs, names, addresses and bracketed IPv6', () => {
    expect(nodesOf('10.0.0.1:6379, redis-0.redis.svc:7000,[::1]:7001')).toEqual([
      { host: '10.0.0.1', port: 6379 },
      { host: 'redis-0.redis.svc', port: 7000 },
      { host: '::1', port: 7001 },
    ]);
  });

  it.each([['redis://a:6379'], ['a'], ['a:0'], ['a:65536'], ['a:6379,'], ['a:6379,b']])(
    'refuses %j, naming the variable and the entry',
    (value) => {
      expect(() => nodesOf(value)).toThrow(/REDIS_CLUSTER_NODES.*entry \d+ must be host:port/s);
    },
  );
});
