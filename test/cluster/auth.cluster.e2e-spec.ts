import { ConfigValidationError } from '@app/config';
import { createRedisClient } from '@app/redis';
import { fieldsOf, jobIdFor, JOBS_STREAM } from '@app/summary-queue';
import { Cluster, Redis, type ClusterOptions } from 'ioredis';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import request from 'supertest';
import { bearer, startApi, TENANT_A, type ApiHarness } from '../support/api-harness';
import { startRedisCluster, type ClusterTlsFiles, type RedisCluster } from '../support/redis-cluster';

/*
 * REDIS_CLUSTER_NODES with credentials and TLS, on a local cluster (three masters with a replica each) whose
 * nodes require a password (requirepass, masterauth), and then one that also serves TLS only: the api enqueues
 * on it, is unready (not crashed) with a wrong password or an untrusted certificate, and refuses mixed schemes
 * at boot. Effects are read back through a Cluster client of the test's own.
 */

const PASSWORD = 'secret';
const body = { text: 'A password-protected cluster keeps the same jobs.', notify: 'someone@example.com' };

const post = (api: ApiHarness, key: string) =>
  request(api.server)
    .post('/v1/summaries')
    .set('Authorization', bearer(TENANT_A))
    .set('Idempotency-Key', key)
    .send(body);

/** REDIS_CLUSTER_NODES for the cluster, every entry `<scheme>://<userinfo>@127.0.0.1:<port>`. */
const nodesEnv = (cluster: RedisCluster, scheme: 'redis' | 'rediss', userinfo: string): string =>
  cluster.ports.map((port) => `${scheme}://${userinfo}@127.0.0.1:${port}`).join(',');

/** A 202 for a new key, and the job's entry in the stream, read by `reader`. */
async function expectEnqueued(api: ApiHarness, reader: Cluster): Promise<void> {
  const key = `auth-${randomUUID()}`;
  const answer = await post(api, key).expect(202);
  const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
  expect(answer.body).toEqual({ job_id: jobId, status: 'queued' });
  const entries = (await reader.xrange(JOBS_STREAM, '-', '+')).map(([, flat]) => fieldsOf(flat));
  expect(entries.filter((e) => e.job_id === jobId)).toHaveLength(1);
}

/** Readiness is 503 with the Redis check (and only it) failing. */
async function expectRedisUnready(api: ApiHarness): Promise<void> {
  const ready = await request(api.server).get('/health/ready').expect(503);
  expect(ready.body).toMatchObject({
    status: 503,
    failing: ['redis'],
    checks: { redis: { status: 'down' }, postgres: { status: 'up' } },
  });
}

async function readerFor(cluster: RedisCluster, options: ClusterOptions): Promise<Cluster> {
  const reader = new Cluster([...cluster.seedNodes], { scaleReads: 'master', ...options });
  reader.on('error', () => undefined);
  await new Promise((resolve) => reader.once('ready', resolve));
  return reader;
}

describe('the cluster client options REDIS_CLUSTER_NODES gives', () => {
  const nodes = [{ host: 'node-0.example', port: 7000 }];

  it('credentials and TLS on every node connection, names left for the certificate check', () => {
    const client = createRedisClient({
      url: 'redis://unused',
      clusterNodes: { nodes, username: 'app', password: 'pw', tls: true },
      connectionName: 'options',
    }) as Cluster;
    expect(client.options.redisOptions).toMatchObject({ username: 'app', password: 'pw', tls: {} });
    const looked: string[] = [];
    client.options.dnsLookup!('node-0.example', (_err, address) => looked.push(address));
    expect(looked).toEqual(['node-0.example']);
    client.disconnect();
  });

  it('none of them for plain host:port entries', () => {
    const client = createRedisClient({
      url: 'redis://unused',
      clusterNodes: { nodes, tls: false },
      connectionName: 'options',
    }) as Cluster;
    expect(client.options.redisOptions).not.toHaveProperty('password');
    expect(client.options.redisOptions).not.toHaveProperty('username');
    expect(client.options.redisOptions).not.toHaveProperty('tls');
    client.disconnect();
  });
});

describe('the api on a password-protected Redis Cluster', () => {
  let redisCluster: RedisCluster;
  let reader: Cluster;
  const apis: ApiHarness[] = [];

  beforeAll(async () => {
    redisCluster = await startRedisCluster({ password: PASSWORD });
    reader = await readerFor(redisCluster, { redisOptions: { password: PASSWORD, disconnectTimeout: 100 } });
  }, 60_000);

  afterAll(async () => {
    for (const api of apis) await api.close();
    reader?.disconnect();
    await redisCluster?.stop();
  });

  it('the nodes do require the password', async () => {
    const anonymous = new Redis({
      host: '127.0.0.1',
      port: redisCluster.ports[0],
      retryStrategy: () => null,
      disconnectTimeout: 100,
    });
    anonymous.on('error', () => undefined);
    await expect(anonymous.ping()).rejects.toThrow(/NOAUTH/);
    anonymous.disconnect();
  });

  it('with the password in REDIS_CLUSTER_NODES: 202 and the stream entry, readiness 200', async () => {
    const api = await startApi({ env: { REDIS_CLUSTER_NODES: nodesEnv(redisCluster, 'redis', `:${PASSWORD}`) } });
    apis.push(api);
    expect(api.client).toBeInstanceOf(Cluster);
    await expectEnqueued(api, reader);
    await request(api.server).get('/health/ready').expect(200);
  }, 30_000);

  it('the password on one entry only is the whole cluster’s', async () => {
    const [first, ...rest] = redisCluster.ports;
    const env = [`redis://:${PASSWORD}@127.0.0.1:${first}`, ...rest.map((p) => `127.0.0.1:${p}`)].join(',');
    const api = await startApi({ env: { REDIS_CLUSTER_NODES: env } });
    apis.push(api);
    await expectEnqueued(api, reader);
  }, 30_000);

  it('with a wrong password: the api starts, unready with the Redis check failing', async () => {
    const api = await startApi({ env: { REDIS_CLUSTER_NODES: nodesEnv(redisCluster, 'redis', ':wrong') } });
    apis.push(api);
    await expectRedisUnready(api);
    await post(api, `auth-${randomUUID()}`).expect(503);
  }, 30_000);

  it('mixed schemes: a ConfigValidationError at boot that names the entry, without the password', async () => {
    const [first, second] = redisCluster.ports;
    const env = `redis://:${PASSWORD}@127.0.0.1:${first},rediss://:${PASSWORD}@127.0.0.1:${second}`;
    const start = startApi({ env: { REDIS_CLUSTER_NODES: env } });
    await expect(start).rejects.toThrow(ConfigValidationError);
    await expect(start).rejects.toThrow(/REDIS_CLUSTER_NODES entry 2 is rediss:\/\/ but entry 1 is not/);
    const message = await start.then(
      () => '',
      (err: Error) => err.message,
    );
    expect(message).not.toContain(PASSWORD);
  });
});

/** A throwaway CA and a certificate it signs for 127.0.0.1, in `dir`. */
function makeCertificates(dir: string): ClusterTlsFiles {
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  openssl(
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '1',
    '-subj',
    '/CN=llmwf test CA',
    '-keyout',
    file('ca.key'),
    '-out',
    file('ca.pem'),
  );
  openssl(
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    '/CN=127.0.0.1',
    '-keyout',
    file('server.key'),
    '-out',
    file('server.csr'),
  );
  writeFileSync(file('server.ext'), 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n');
  openssl(
    'x509',
    '-req',
    '-in',
    file('server.csr'),
    '-CA',
    file('ca.pem'),
    '-CAkey',
    file('ca.key'),
    '-CAcreateserial',
    '-days',
    '1',
    '-extfile',
    file('server.ext'),
    '-out',
    file('server.pem'),
  );
  return { certFile: file('server.pem'), keyFile: file('server.key'), caFile: file('ca.pem') };
}

/*
 * TLS needs no variable of ours for the CA: the client checks the certificate against Node's CA store, which
 * an operator extends with NODE_EXTRA_CA_CERTS. That variable is read once when Node starts, so this test,
 * which runs the api in the jest process, extends the store the same way at run time
 * (tls.setDefaultCACertificates) and puts it back afterwards.
 */
describe('the api on a Redis Cluster with TLS and a password', () => {
  let dir: string;
  let files: ClusterTlsFiles;
  let redisCluster: RedisCluster;
  let reader: Cluster;
  const apis: ApiHarness[] = [];
  const defaultCAs = tls.getCACertificates('default');
  const env = () => ({ REDIS_CLUSTER_NODES: nodesEnv(redisCluster, 'rediss', `default:${PASSWORD}`) });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'llmwf-cluster-tls-'));
    files = makeCertificates(dir);
    redisCluster = await startRedisCluster({ password: PASSWORD, tls: files });
    reader = await readerFor(redisCluster, {
      redisOptions: { password: PASSWORD, tls: { ca: readFileSync(files.caFile) }, disconnectTimeout: 100 },
    });
  }, 60_000);

  afterAll(async () => {
    tls.setDefaultCACertificates(defaultCAs);
    for (const api of apis) await api.close();
    reader?.disconnect();
    await redisCluster?.stop();
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  it('the nodes serve TLS only: a plain connection fails', async () => {
    const plain = new Cluster([...redisCluster.seedNodes], {
      clusterRetryStrategy: () => null,
      redisOptions: { password: PASSWORD, connectTimeout: 1000, disconnectTimeout: 100 },
    });
    plain.on('error', () => undefined);
    await expect(plain.connect()).rejects.toThrow();
    plain.disconnect();
  });

  it('the CA not trusted: the api starts, unready with the Redis check failing', async () => {
    const api = await startApi({ env: env() });
    apis.push(api);
    await expectRedisUnready(api);
  }, 30_000);

  it('the CA in Node’s store: 202 and the stream entry over rediss://, readiness 200', async () => {
    tls.setDefaultCACertificates([...defaultCAs, readFileSync(files.caFile, 'utf8')]);
    const api = await startApi({ env: env() });
    apis.push(api);
    await expectEnqueued(api, reader);
    await request(api.server).get('/health/ready').expect(200);
  }, 30_000);
});
