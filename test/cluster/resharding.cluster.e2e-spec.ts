import { keySlot } from '@app/redis';
import { fieldsOf, jobIdFor, JOBS_STREAM } from '@app/summary-queue';
import { Cluster } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { bearer, startApi, TENANT_A, type ApiHarness } from '../support/api-harness';
import { eventually } from '../support/infra';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * POST /v1/summaries sent without pause while the job stream's slot moves to
 * another master (resharding), with half the keys chosen so that their
 * idempotency records live in that slot too. Timeline:
 *   marked:   the target IMPORTING, the source MIGRATING. A new record is
 *             missing at the source: its claim is answered ASK, and runs on the
 *             target after ASKING. A job (its new record beside the existing
 *             stream) is answered TRYAGAIN, and waits.
 *   moved:    every key of the slot MIGRATEd. The job is ASKed to the target,
 *             where its record is still missing beside the stream: TRYAGAIN.
 *   handed:   the slot the target's on every master: MOVED, then served.
 * Each step waits for an effect of the requests (a record made on the target
 * through ASK) before the next, so every step has requests in it.
 *
 * Asserted: every answer a 202 (no 5xx: ASK and TRYAGAIN are followed, not
 * answered 503), each accepted job exactly once in the stream, each record
 * stored, and the slot's keys all on the target.
 */

interface Sent {
  readonly key: string;
  readonly status: number;
  readonly type: string | undefined;
}

const record = (key: string) => `idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`;
const jobOf = (key: string) => jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);

/** `count` new keys whose idempotency records hash to `slot` (one in 16384 does: found by trying). */
function keysWhoseRecordIsIn(slot: number, count: number): string[] {
  const keys: string[] = [];
  const base = randomUUID();
  for (let i = 0; keys.length < count; i++) {
    const key = `reshard-${base}-${i}`;
    if (keySlot(record(key)) === slot) keys.push(key);
  }
  return keys;
}

describe('POST /v1/summaries while the job stream’s slot moves to another master', () => {
  let redisCluster: RedisCluster;
  let cluster: Cluster;
  let api: ApiHarness;
  const body = { text: 'A job sent while its slot changes masters.', notify: 'someone@example.com' };

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

  const post = async (key: string): Promise<Sent> => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);
    return { key, status: res.status, type: (res.body as { type?: string }).type };
  };

  it('no 5xx, each accepted job once in the stream and each record stored; the slot ends on its new master', async () => {
    const slot = keySlot(JOBS_STREAM);
    const from = await redisCluster.masterOf(slot);
    const to = (await redisCluster.masters()).find((m) => m.port !== from)!.port;
    const inSlot = keysWhoseRecordIsIn(slot, 60);
    const nextKey = (lane: number, n: number) =>
      n % 2 === 0 && inSlot.length > 0 ? inSlot.shift()! : `reshard-other-${lane}-${randomUUID()}`;

    const sent: Sent[] = [];
    let running = true;
    const lanes = Array.from({ length: 4 }, async (_, lane) => {
      for (let n = 0; running; n++) sent.push(await post(nextKey(lane, n)));
    });
    // Probes of the slot's records, one per step, each followed until its claim has run on the target.
    const probes: Promise<Sent>[] = [];
    const probeOnTarget = async (step: string) => {
      const key = keysWhoseRecordIsIn(slot, 1)[0];
      probes.push(post(key));
      // The target serves a key of a slot it imports only to a command right after ASKING, on the same connection.
      const onTarget = async () => {
        await redisCluster.command(to, 'ASKING');
        return (await redisCluster.command(to, 'EXISTS', record(key))) === 1 ? true : undefined;
      };
      await eventually(onTarget, 10_000, `a claim made on the target through ASK (${step})`);
    };

    try {
      await eventually(async () => (sent.length >= 20 ? true : undefined), 10_000, 'traffic before the move');
      await redisCluster.moveSlot(slot, to, (step) => probeOnTarget(step));
      const handedAt = sent.length;
      await eventually(async () => (sent.length >= handedAt + 20 ? true : undefined), 10_000, 'traffic after the move');
    } finally {
      running = false;
      await Promise.all(lanes);
    }
    const all = [...sent, ...(await Promise.all(probes))];

    const byStatus: Record<string, number> = {};
    for (const s of all)
      byStatus[`${s.status} ${s.type ?? ''}`.trim()] = (byStatus[`${s.status} ${s.type ?? ''}`.trim()] ?? 0) + 1;
    console.log('resharding the job stream’s slot, POSTs meanwhile:', JSON.stringify({ from, to, byStatus }));
    expect(all.filter((s) => s.status !== 202)).toEqual([]);

    const entries = (await cluster.xrange(JOBS_STREAM, '-', '+')).map(([, flat]) => fieldsOf(flat).job_id);
    const counts = new Map<string, number>();
    for (const id of entries) counts.set(id, (counts.get(id) ?? 0) + 1);
    expect(all.filter((s) => counts.get(jobOf(s.key)) !== 1).map((s) => [s.key, counts.get(jobOf(s.key))])).toEqual([]);
    const states = await Promise.all(all.map((s) => cluster.hget(record(s.key), 'state')));
    expect(states.filter((state) => state !== 'completed')).toEqual([]);
    // At least one of the slot's records was claimed on the target before the hand-over (the probes), and the
    // slot's keys are all there now.
    expect(all.filter((s) => keySlot(record(s.key)) === slot).length).toBeGreaterThanOrEqual(2);
    expect(await redisCluster.masterOf(slot)).toBe(to);
    expect(await redisCluster.command(from, 'CLUSTER', 'COUNTKEYSINSLOT', slot)).toBe(0);
    expect(Number(await redisCluster.command(to, 'CLUSTER', 'COUNTKEYSINSLOT', slot))).toBeGreaterThan(0);
  }, 90_000);
});
