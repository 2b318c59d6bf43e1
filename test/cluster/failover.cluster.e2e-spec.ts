import { keySlot } from '@app/redis';
import { fieldsOf, jobIdFor, JOBS_STREAM } from '@app/summary-queue';
import { Cluster } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { bearer, startApi, TENANT_A, type ApiHarness } from '../support/api-harness';
import { eventually } from '../support/infra';
import { metricValue } from '../support/metrics';
import { startRedisCluster, type FailoverResult, type RedisCluster } from '../support/redis-cluster';

/*
 * POST /v1/summaries sent without pause while the master of the job stream
 * fails over: by hand (CLUSTER FAILOVER on its replica), then by losing it
 * (SIGSTOP: it holds its connections and answers nothing, as behind a
 * partition; then SIGKILL: the connections close at once). Its replica takes
 * over after cluster-node-timeout, 2 s here. The kill comes last: the shard
 * has no replica after it.
 *
 * Asserted: every answer is a 202 or a clear 503 (problem+json), never
 * another 5xx, and every 202 has its stream entry afterwards, whichever way
 * the master went: the enqueue answers 202 only once a replica holds the
 * entry (WAIT), and that replica is the one promoted. A shard left without a
 * replica (after the kill) takes no job: 503 until one is back. The 503s, the
 * window they came in and the client's slot refreshes are logged.
 */

const IN_PROGRESS = 'urn:llm-workflows:problem:idempotency-request-in-progress';

interface Sent {
  readonly key: string;
  readonly jobId: string;
  readonly status: number;
  readonly type: string | undefined;
  readonly detail: string | undefined;
  readonly ms: number;
  readonly at: number;
}

describe('POST /v1/summaries through a failover of the job stream’s master', () => {
  let redisCluster: RedisCluster;
  let cluster: Cluster;
  let api: ApiHarness;
  const body = { text: 'A job sent while its master changes hands.', notify: 'someone@example.com' };

  beforeAll(async () => {
    redisCluster = await startRedisCluster();
    cluster = new Cluster([...redisCluster.seedNodes], {
      scaleReads: 'master',
      redisOptions: { disconnectTimeout: 100, commandTimeout: 5000 },
    });
    cluster.on('error', () => undefined);
    await new Promise((resolve) => cluster.once('ready', resolve));
    api = await startApi({ env: { REDIS_CLUSTER_NODES: redisCluster.seedNodesEnv } });
  }, 60_000);

  afterAll(async () => {
    await api?.close();
    cluster?.disconnect();
    await redisCluster?.stop();
  });

  const postNew = (prefix: string) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', `${prefix}-${randomUUID()}`)
      .send(body);

  const postKey = (to: ApiHarness, key: string) =>
    request(to.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);

  /**
   * `lanes` loops, each posting a new key as soon as its last answer came, until stopped; with `same key`, a lane
   * whose key got a 503 sends that key again, as a client honouring Retry-After would, until it is accepted.
   */
  function traffic(lanes = 4, retries: 'new key' | 'same key' = 'new key') {
    const sent: Sent[] = [];
    let running = true;
    // Once stopped, a lane still retrying its key gives up after this: the test then says which keys were not accepted.
    let retryUntil = Number.POSITIVE_INFINITY;
    const loops = Array.from({ length: lanes }, async () => {
      let key = `failover-${randomUUID()}`;
      for (let last = 202; running || (retries === 'same key' && last !== 202 && Date.now() < retryUntil);) {
        if (last === 202 || retries === 'new key') key = `failover-${randomUUID()}`;
        const started = Date.now();
        const res = await request(api.server)
          .post('/v1/summaries')
          .set('Authorization', bearer(TENANT_A))
          .set('Idempotency-Key', key)
          .send(body);
        sent.push({
          key,
          jobId: jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`),
          status: res.status,
          type: (res.body as { type?: string }).type,
          detail: (res.body as { detail?: string }).detail,
          ms: Date.now() - started,
          at: started,
        });
        last = res.status;
        if (res.status !== 202) await new Promise((r) => setTimeout(r, 20));
      }
    });
    return {
      async stop(): Promise<Sent[]> {
        running = false;
        retryUntil = Date.now() + 15_000;
        await Promise.all(loops);
        return sent;
      },
    };
  }

  const streamJobIds = async () =>
    new Set((await cluster.xrange(JOBS_STREAM, '-', '+')).map(([, flat]) => fieldsOf(flat).job_id));

  /** Runs traffic from a second before the fault until two seconds after the cluster settled. */
  async function through(
    fault: () => Promise<FailoverResult>,
    retries: 'new key' | 'same key' = 'new key',
    heal: () => void = () => undefined,
  ) {
    const load = traffic(4, retries);
    await new Promise((r) => setTimeout(r, 1000));
    const faultAt = Date.now();
    const events: string[] = [];
    const note = (what: string) => (detail?: unknown) =>
      events.push(`${Date.now() - faultAt}ms ${what}${detail instanceof Error ? `: ${detail.message}` : ''}`);
    const listeners = ['ready', 'close', 'reconnecting', 'end', '-node', '+node', 'error', 'refresh'].map(
      (name) => [name, note(name)] as const,
    );
    for (const [name, listener] of listeners) api.client.on(name, listener);
    const result = await fault();
    await new Promise((r) => setTimeout(r, 2000));
    const sent = await load.stop();
    for (const [name, listener] of listeners) api.client.off(name, listener);
    heal();
    const byStatus: Record<string, number> = {};
    for (const s of sent)
      byStatus[`${s.status} ${s.type ?? ''}`.trim()] = (byStatus[`${s.status} ${s.type ?? ''}`.trim()] ?? 0) + 1;
    const failed = sent.filter((s) => s.status !== 202);
    const window =
      failed.length > 0 ? Math.max(...failed.map((s) => s.at + s.ms)) - Math.min(...failed.map((s) => s.at)) : 0;
    const accepted = sent.filter((s) => s.status === 202);
    const inStream = await streamJobIds();
    const lost = accepted.filter((s) => !inStream.has(s.jobId));
    const summary = {
      fault: `${result.from} -> ${result.to} settled in ${result.ms} ms`,
      requests: sent.length,
      byStatus,
      failureWindowMs: window,
      slowestMs: Math.max(...sent.map((s) => s.ms)),
      accepted: accepted.length,
      acceptedWithoutEntry: lost.length,
      firstFailureMs: failed.length > 0 ? Math.min(...failed.map((x) => x.at)) - faultAt : undefined,
      details: [...new Set(failed.map((x) => x.detail))],
      clientEvents: [...new Set(events)].slice(0, 30),
    };
    return { sent, accepted, lost, summary };
  }

  const assertNoOther5xx = (sent: readonly Sent[]) => {
    const unexpected = sent.filter((s) => s.status !== 202 && s.status !== 503);
    expect(unexpected).toEqual([]);
    for (const s of sent.filter((x) => x.status === 503)) expect(s.type).toMatch(/^urn:llm-workflows:problem:/);
  };

  it('a manual failover: every answer is 202 or 503, and every 202 has its entry', async () => {
    const master = await redisCluster.masterOf(keySlot(JOBS_STREAM));
    const { sent, lost, accepted, summary } = await through(() => redisCluster.failover(master));
    console.log('manual failover of the job stream’s master, POSTs meanwhile:', JSON.stringify(summary));
    expect(accepted.length).toBeGreaterThan(20);
    assertNoOther5xx(sent);
    expect(lost).toEqual([]);
    // The api kept its client: a request now goes through.
    await postNew('after-failover').expect(202);
  }, 60_000);

  it('a master that stops answering (SIGSTOP, as behind a partition): 202 or 503, and the client finds the new master', async () => {
    const slot = keySlot(JOBS_STREAM);
    const master = await redisCluster.masterOf(slot);
    const pid = redisCluster.pids[redisCluster.ports.indexOf(master)];
    const { sent, accepted, summary } = await through(
      async () => {
        const started = Date.now();
        process.kill(pid, 'SIGSTOP');
        let to = master;
        while (to === master && Date.now() - started < 20_000) {
          await new Promise((r) => setTimeout(r, 100));
          to = await redisCluster.masterOf(slot).catch(() => master);
        }
        return { from: master, to, ms: Date.now() - started };
      },
      'new key',
      () => process.kill(pid, 'SIGCONT'),
    );
    console.log('stopped the job stream’s master, POSTs meanwhile:', JSON.stringify(summary));
    assertNoOther5xx(sent);
    // Resumed, the old master rejoins as the new one's replica. Until it has heard of the failover it still answers as
    // the master of its old slots, with its old stream: every 202's entry is read once it has rejoined.
    await eventually(
      async () => ((await redisCluster.replicas()).some((r) => r.port === master) ? true : undefined),
      20_000,
      'the resumed master a replica again',
    );
    const inStream = await streamJobIds();
    expect(accepted.filter((s) => !inStream.has(s.jobId))).toEqual([]);
    const resumed = Date.now();
    const status = await eventually(
      async () => ((await postNew('after-stop')).status === 202 ? 202 : undefined),
      20_000,
      'a 202 once the resumed master is a replica again',
    );
    console.log(`202 again ${Date.now() - resumed} ms after the stopped master resumed`);
    expect(status).toBe(202);
  }, 60_000);

  it('a killed master: every key is accepted, through the kill and after it on the shard left without a replica, each unreplicated write counted', async () => {
    const master = await redisCluster.masterOf(keySlot(JOBS_STREAM));
    const before = await metricValue(api.server, 'redis_unreplicated_writes_total');
    const { sent, lost, accepted, summary } = await through(() => redisCluster.killMaster(master), 'same key');
    console.log('killed the job stream’s master, POSTs meanwhile:', JSON.stringify(summary));
    expect(accepted.length).toBeGreaterThan(20);
    // A retry may also find its key still held by the attempt the kill cut (409, until that lock expires).
    assertNoOther5xx(sent.filter((s) => s.status !== 409 || s.type !== IN_PROGRESS));
    expect(lost).toEqual([]);
    // Every key a lane sent was accepted in the end: a 503 during the kill was retried with the same key.
    expect(new Set(accepted.map((s) => s.key))).toEqual(new Set(sent.map((s) => s.key)));

    // The promoted replica has no replica of its own. Every job goes to its stream, and about a third of the records
    // hash to it: each key is accepted at its first request, and written without a replica, counted.
    const replicas = await redisCluster.replicas();
    const promotedPort = await redisCluster.masterOf(keySlot(JOBS_STREAM));
    const promoted = (await redisCluster.nodes()).find((n) => n.port === promotedPort);
    expect(replicas.filter((r) => r.masterId === promoted?.id)).toEqual([]);
    const counted = await metricValue(api.server, 'redis_unreplicated_writes_total');
    const fresh = Array.from({ length: 30 }, () => `after-kill-${randomUUID()}`);
    const answers = await Promise.all(fresh.map((key) => postKey(api, key)));
    expect(answers.map((a) => a.status)).toEqual(fresh.map(() => 202));
    const inStream = await streamJobIds();
    expect(fresh.filter((key) => !inStream.has(jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`)))).toEqual([]);
    // One enqueue each at least, on the shard without a replica.
    expect((await metricValue(api.server, 'redis_unreplicated_writes_total')) - counted).toBeGreaterThanOrEqual(
      fresh.length,
    );
    expect(counted).toBeGreaterThan(before);
  }, 60_000);

  it('REDIS_DURABILITY=strict: the shard left without a replica accepts no key, and a refused key is freed', async () => {
    // The killed-master test above left the job stream's shard without a replica: this test needs that.
    const shardMaster = await redisCluster.masterOf(keySlot(JOBS_STREAM));
    const shardMasterId = (await redisCluster.nodes()).find((n) => n.port === shardMaster)?.id;
    expect((await redisCluster.replicas()).filter((r) => r.masterId === shardMasterId)).toEqual([]);
    const strict = await startApi({
      env: { REDIS_CLUSTER_NODES: redisCluster.seedNodesEnv, REDIS_DURABILITY: 'strict' },
    });
    try {
      const key = `strict-${randomUUID()}`;
      const refused = await postKey(strict, key);
      expect(refused.status).toBe(503);
      // Refused at the claim or at the enqueue: whichever of the key's record and the job lands on the shard
      // without a replica first (the record's slot follows the key, which is new each time).
      expect([
        'urn:llm-workflows:problem:service-unavailable',
        'urn:llm-workflows:problem:idempotency-store-unavailable',
      ]).toContain(refused.body.type);
      expect(refused.headers['retry-after']).toMatch(/^\d+$/);
      // Nothing of the refused request holds its key: the retry is refused again, not told it is in progress (409).
      const retried = await postKey(strict, key);
      expect(retried.status).toBe(503);
    } finally {
      await strict.close();
    }
  }, 60_000);
});
