import { ConfigValidationError } from './config.errors';
import { commonEnv, parseConfig } from './env-schema';

const nodesOf = (value: string | undefined) =>
  parseConfig({ redisClusterNodes: commonEnv.redisClusterNodes }, { REDIS_CLUSTER_NODES: value }).redisClusterNodes;

/** The message REDIS_CLUSTER_NODES=value stops the start with. */
const errorOf = (value: string): string => {
  try {
    nodesOf(value);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigValidationError);
    return (err as Error).message;
  }
  throw new Error(`${value} was accepted`);
};

describe('REDIS_CLUSTER_NODES', () => {
  it('unset or empty: no cluster', () => {
    expect(nodesOf(undefined)).toBeUndefined();
    expect(nodesOf('')).toBeUndefined();
    expect(nodesOf('  ')).toBeUndefined();
  });

  it('host:port pairs, names, addresses and bracketed IPv6: no credentials, no TLS', () => {
    expect(nodesOf('10.0.0.1:6379, redis-0.redis.svc:7000,[::1]:7001')).toEqual({
      nodes: [
        { host: '10.0.0.1', port: 6379 },
        { host: 'redis-0.redis.svc', port: 7000 },
        { host: '::1', port: 7001 },
      ],
      tls: false,
    });
  });

  it('redis:// entries, with or without a trailing slash, mixed with host:port', () => {
    expect(nodesOf('redis://a:7000,b:7001,redis://[::1]:7002/')).toEqual({
      nodes: [
        { host: 'a', port: 7000 },
        { host: 'b', port: 7001 },
        { host: '::1', port: 7002 },
      ],
      tls: false,
    });
  });

  it('rediss:// entries: TLS', () => {
    expect(nodesOf('rediss://a:7000,rediss://[fe80::1]:7001')).toEqual({
      nodes: [
        { host: 'a', port: 7000 },
        { host: 'fe80::1', port: 7001 },
      ],
      tls: true,
    });
  });

  it('a password alone (the default user), or an ACL user and password', () => {
    expect(nodesOf('redis://:secret@a:7000,redis://:secret@b:7001')).toEqual({
      nodes: [
        { host: 'a', port: 7000 },
        { host: 'b', port: 7001 },
      ],
      password: 'secret',
      tls: false,
    });
    expect(nodesOf('rediss://app:s3cret@a:7000')).toEqual({
      nodes: [{ host: 'a', port: 7000 }],
      username: 'app',
      password: 's3cret',
      tls: true,
    });
  });

  it('credentials on some entries apply to all', () => {
    expect(nodesOf('a:7000,redis://app:pw@b:7001,redis://c:7002')).toEqual({
      nodes: [
        { host: 'a', port: 7000 },
        { host: 'b', port: 7001 },
        { host: 'c', port: 7002 },
      ],
      username: 'app',
      password: 'pw',
      tls: false,
    });
  });

  it('percent-encoded credentials are decoded; an unencoded @ in the password is taken up to the host', () => {
    expect(nodesOf('redis://us%3Aer:p%40ss%2Fw%3Ard@a:7000')).toMatchObject({
      username: 'us:er',
      password: 'p@ss/w:rd',
    });
    expect(nodesOf('redis://:p@ss@a:7000')).toMatchObject({ nodes: [{ host: 'a', port: 7000 }], password: 'p@ss' });
  });

  it.each([['a'], ['a:0'], ['a:65536'], ['a:6379,'], ['a:6379,b'], ['http://a:6379'], ['redis://a'], ['redis://a:0']])(
    'refuses %j, naming the variable and the entry',
    (value) => {
      expect(errorOf(value)).toMatch(/REDIS_CLUSTER_NODES.*entry \d+ must be host:port, redis:\/\/.* or rediss:\/\//s);
    },
  );

  it.each([
    ['a:7000,rediss://b:7001', 2],
    ['rediss://a:7000,redis://b:7001', 2],
    ['rediss://a:7000,rediss://b:7001,c:7002', 3],
  ])('refuses %j: every entry TLS or none (entry %d)', (value, position) => {
    expect(errorOf(value)).toMatch(
      new RegExp(`REDIS_CLUSTER_NODES entry ${position} .*every entry must use TLS \\(rediss://\\) or none`),
    );
  });

  it.each([
    ['redis://:one@a:7000,redis://:two@b:7001', 2, 1],
    ['redis://:pw@a:7000,b:7001,redis://app:pw@c:7002', 3, 1],
    ['a:7000,redis://app:pw@b:7001,redis://other:pw@c:7002', 3, 2],
  ])('refuses %j: other credentials on entry %d than on entry %d', (value, position, first) => {
    expect(errorOf(value)).toMatch(
      new RegExp(
        `REDIS_CLUSTER_NODES entry ${position} has other credentials than entry ${first}: ` +
          'credentials must be the same wherever given',
      ),
    );
  });

  it.each([['redis://a:7000/0'], ['redis://a:7000/2'], ['rediss://:pw@a:7000/1'], ['redis://a:7000?db=1']])(
    'refuses %j: a cluster has database 0 only',
    (value) => {
      expect(errorOf(value)).toMatch(
        /REDIS_CLUSTER_NODES entry 1 must not name a database or path \(a cluster has only database 0\)/,
      );
    },
  );

  it('refuses a user without a password', () => {
    expect(errorOf('redis://app@a:7000')).toMatch(/REDIS_CLUSTER_NODES entry 1 names a user without a password/);
    expect(errorOf('redis://app:@a:7000')).toMatch(/entry 1 names a user without a password/);
  });

  it.each([
    ['redis://:hunter2@a:7000,redis://:hunter2-other@b:7001'],
    ['redis://app:hunter2@a:7000,rediss://app:hunter2@b:7001'],
    ['redis://app:hunter2@a:7000/3'],
    ['redis://app:hunter2@a'],
    ['redis://app:hunter2@a:99999'],
    ['redis://app:hun/ter2@a:7000,x'],
    ['app:hunter2@a:7000'],
    ['redis://app:hunter2%zz@a:7000'],
    ['redis://app:hunter2@@a:7000/x'],
  ])('never shows the password in its error: %j', (value) => {
    const message = errorOf(value);
    expect(message).toMatch(/REDIS_CLUSTER_NODES entry \d/);
    expect(message).not.toContain('hunter2');
    expect(message).not.toContain('hun/ter2');
  });
});
