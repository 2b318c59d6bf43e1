import { keySlot } from '@app/redis';
import { CONSUMER_GROUP, jobIdFor, partitionOf, SummaryJobQueue, SummaryStreams } from '@app/summary-queue';
import { Cluster } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { WorkerMetrics } from '../../libs/workflows/src/worker.metrics';
import { bearer, startApi, TENANT_A, type ApiHarness } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, testDataSource, truncateAll } from '../support/infra';
import { startRedisCluster, type FailoverResult, type RedisCluster } from '../support/redis-cluster';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * The api and two workers on a local Redis Cluster (three masters, a replica
 * each), the job stream in three partitions, one per master. POSTs with new
 * keys go on without pause while the workers consume them, with a model that
 * takes 20 to 50 ms a call; meanwhile one partition's master fails over:
 *
 *   t=0      four lanes POST, each a new key as soon as its last answer came
 *   t=1s     (a) CLUSTER FAILOVER on the replica of partition 0's master, or
 *            (b) SIGKILL of another partition's master (its replica takes over
 *            after cluster-node-timeout, 2 s; the shard has no replica then)
 *   settled  + 2 s of POSTs, then the lanes stop
 *   drain    until every partition's stream is empty with nothing pending
 *   probe    new jobs into the failed-over partition, enqueued by the test's
 *            own producer once the workers sit idle in their blocking reads:
 *            they must be done too, so each worker's blocking connection for
 *            it found the new master; then new jobs through the api: (a) 202
 *            (the old master is the new one's replica), (b) 202 too (no
 *            replica left: written unreplicated, REDIS_DURABILITY=replica),
 *            and each done
 *
 * Asserted, with effects counted after the fact: every answer is a 202 or a
 * problem+json 503; every 202 has one summaries row and one outbox row; no
 * job has two outbox rows; every row belongs to a job this test sent. A 503
 * may have left its entry (written, not replicated in time): such a job runs
 * once, and is counted, not failed. A model call cut off by the failover may
 * be made again by a redelivery: counted and logged, not asserted.
 */

const PARTITIONS = 3;
const CLAIM_IDLE_MS = 3000;
const DRAIN_MS = 60_000;

interface Sent {
  readonly key: string;
  readonly jobId: string;
  readonly partition: number;
  /** 0 when the request got no answer at all. */
  readonly status: number;
  readonly problemJson: boolean;
  readonly type: string | undefined;
  readonly detail: string | undefined;
  readonly at: number;
  readonly ms: number;
}

describe('the workers on a Redis Cluster through failovers of a partition’s master', () => {
  let redisCluster: RedisCluster;
  let cluster: Cluster;
  let model: FakeOpenAiServer;
  let api: ApiHarness;
  let workers: WorkerHarness[] = [];
  let db: DataSource;
  const streams = new SummaryStreams(PARTITIONS);
  /** Every job this test asked the api for, by job id (lower case), over both scenarios. */
  const everySent = new Map<string, Sent>();
  /** The jobs this test enqueued itself, past the api (lower case). */
  const enqueuedDirectly = new Set<string>();

  const textOf = (key: string) => `Summarise the job sent with the key ${key}.`;
  const jobIdOf = (key: string) => jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
  const idempotencyRecordOf = (key: string) => `idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`;

  beforeAll(async () => {
    redisCluster = await startRedisCluster();
    cluster = new Cluster([...redisCluster.seedNodes], {
      scaleReads: 'master',
      redisOptions: { disconnectTimeout: 100, commandTimeout: 5000 },
    });
    cluster.on('error', () => undefined);
    await new Promise((resolve) => cluster.once('ready', resolve));
    db = await testDataSource();
    await truncateAll(db);
    model = await new FakeOpenAiServer(() => ({
      kind: 'complete',
      content: 'A short summary.',
      delayMs: 20 + Math.floor(Math.random() * 31),
    })).start();
    const env = { REDIS_CLUSTER_NODES: redisCluster.seedNodesEnv, JOB_STREAM_PARTITIONS: String(PARTITIONS) };
    api = await startApi({ env });
    for (let i = 0; i < 2; i++)
      workers.push(
        await startWorker({
          modelUrl: model.baseUrl,
          env: { ...env, CLAIM_IDLE_MS: String(CLAIM_IDLE_MS) },
          consumer: { autoStart: true },
        }),
      );
  }, 60_000);

  afterAll(async () => {
    await Promise.all(workers.map((w) => w.close()));
    workers = [];
    await api?.close();
    await model?.stop();
    await db?.destroy();
    cluster?.disconnect();
    await redisCluster?.stop();
  }, 60_000);

  async function post(key: string): Promise<Sent> {
    const jobId = jobIdOf(key);
    const started = Date.now();
    let sent: Sent;
    try {
      const res = await request(api.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .send({ text: textOf(key), notify: 'someone@example.com' });
      const problem = res.body as { type?: string; detail?: string };
      sent = {
        key,
        jobId,
        partition: partitionOf(jobId, PARTITIONS),
        status: res.status,
        problemJson: /^application\/problem\+json/.test(String(res.headers['content-type'])),
        type: problem.type,
        detail: problem.detail,
        at: started,
        ms: Date.now() - started,
      };
    } catch (err) {
      sent = {
        key,
        jobId,
        partition: partitionOf(jobId, PARTITIONS),
        status: 0,
        problemJson: false,
        type: undefined,
        detail: (err as Error).message,
        at: started,
        ms: Date.now() - started,
      };
    }
    everySent.set(jobId.toLowerCase(), sent);
    return sent;
  }

  /**
   * `lanes` loops, each posting a new key as soon as its last answer came, until stopped. After a refusal a lane
   * first waits for an answer (or an error) from the job's partition on the test's own client, so that a Redis
   * that fails at once does not turn the lanes into busy loops.
   */
  function traffic(lanes = 4) {
    const sent: Sent[] = [];
    let running = true;
    const loops = Array.from({ length: lanes }, async () => {
      while (running) {
        const s = await post(`worker-failover-${randomUUID()}`);
        sent.push(s);
        if (s.status !== 202) await cluster.xlen(streams.partitions[s.partition].jobs).catch(() => undefined);
      }
    });
    return {
      /** What the lanes sent so far, as it grows. */
      sent,
      async stop(): Promise<Sent[]> {
        running = false;
        await Promise.all(loops);
        return sent;
      },
    };
  }

  /** A new key whose job lands in `partition`, its idempotency record not on `avoidPort` when given. */
  async function keyFor(partition: number, avoidPort?: number): Promise<string> {
    for (;;) {
      const key = `worker-failover-probe-${randomUUID()}`;
      if (partitionOf(jobIdOf(key), PARTITIONS) !== partition) continue;
      if (avoidPort !== undefined && (await redisCluster.masterOf(keySlot(idempotencyRecordOf(key)))) === avoidPort)
        continue;
      return key;
    }
  }

  /** Entries in the streams and pending in the group, all partitions; undefined while a node does not answer. */
  async function backlog(): Promise<{ entries: number; pending: number } | undefined> {
    try {
      let entries = 0;
      let pending = 0;
      for (const p of streams.partitions) {
        entries += await cluster.xlen(p.jobs);
        pending += Number(((await cluster.xpending(p.jobs, CONSUMER_GROUP)) as [number])[0]);
      }
      return { entries, pending };
    } catch {
      return undefined;
    }
  }

  /** Waits (bounded) until the streams are empty, nothing pending, no job running; returns how long it took. */
  async function drain(): Promise<number> {
    const started = Date.now();
    let last: { entries: number; pending: number } | undefined;
    await eventually(
      async () => {
        last = await backlog();
        const idle = workers.every((w) => w.consumer.inFlightCount === 0);
        return last?.entries === 0 && last.pending === 0 && idle ? true : undefined;
      },
      DRAIN_MS,
      `every partition drained (last seen: ${JSON.stringify(last)})`,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last seen ${JSON.stringify(last)}`);
    });
    return Date.now() - started;
  }

  async function deadLetters(): Promise<number> {
    let n = 0;
    for (const p of streams.partitions) n += await cluster.xlen(p.dead);
    return n;
  }

  /** The workers' delivery outcomes and reclaims, summed over both. */
  async function workerFigures(): Promise<Record<string, number>> {
    const figures: Record<string, number> = {};
    for (const w of workers) {
      const metrics = w.app.get(WorkerMetrics);
      for (const { labels, value } of (await metrics.jobs.get()).values)
        figures[String(labels.outcome)] = (figures[String(labels.outcome)] ?? 0) + value;
      for (const { value } of (await metrics.reclaimed.get()).values)
        figures.reclaimed = (figures.reclaimed ?? 0) + value;
    }
    return figures;
  }

  const delta = (after: Record<string, number>, before: Record<string, number>) =>
    Object.fromEntries(Object.entries(after).map(([k, v]) => [k, v - (before[k] ?? 0)]));

  /** The effects in PostgreSQL and at the model, by job id (lower case). */
  async function effects() {
    const summaries = new Set(
      (await db.query<{ job_id: string }[]>('SELECT job_id::text AS job_id FROM summaries')).map((r) => r.job_id),
    );
    const outbox = new Map(
      (
        await db.query<{ job_id: string; n: number }[]>(
          `SELECT lower(payload->>'job_id') AS job_id, count(*)::int AS n FROM outbox GROUP BY 1`,
        )
      ).map((r) => [r.job_id, r.n]),
    );
    const callsByText = new Map<string, number>();
    for (const r of model.requests) callsByText.set(r.userText, (callsByText.get(r.userText) ?? 0) + 1);
    const callsOf = (s: Sent) => callsByText.get(textOf(s.key)) ?? 0;
    return { summaries, outbox, callsOf };
  }

  /**
   * Traffic from before the fault (once jobs are accepted and the workers are running them) until after the cluster
   * settled (once jobs into the failed-over `partition` are accepted again), then the drain; checks every effect of
   * what was sent and returns the figures.
   */
  async function through(name: string, partition: number, fault: () => Promise<FailoverResult>) {
    const figuresBefore = await workerFigures();
    const callsBefore = model.calls;
    const load = traffic();
    // The fault strikes while the workers consume: jobs accepted into the partition, and the model called.
    await eventually(
      () => {
        const accepted = load.sent.filter((s) => s.status === 202);
        return accepted.length >= 20 &&
          accepted.some((s) => s.partition === partition) &&
          model.calls - callsBefore >= 10
          ? true
          : undefined;
      },
      30_000,
      'jobs accepted and being run before the fault',
    );
    const faultAt = Date.now();
    const result = await fault();
    const settledAt = Date.now();
    // Traffic goes on until the new master has taken jobs: requests sent after the cluster settled, accepted into the
    // failed-over partition.
    await eventually(
      () =>
        load.sent.filter((s) => s.status === 202 && s.partition === partition && s.at >= settledAt).length >= 10
          ? true
          : undefined,
      DRAIN_MS,
      `jobs accepted into partition ${partition} after the cluster settled`,
    );
    const sent = await load.stop();
    const drainMs = await drain();

    const { summaries, outbox, callsOf } = await effects();
    const accepted = sent.filter((s) => s.status === 202);
    const unavailable = sent.filter((s) => s.status === 503);
    const other = sent.filter((s) => s.status !== 202 && s.status !== 503);
    const unclear503 = unavailable.filter((s) => !s.problemJson || !s.type?.startsWith('urn:llm-workflows:problem:'));
    const withoutSummary = accepted.filter((s) => !summaries.has(s.jobId.toLowerCase()));
    const outboxNotOnce = accepted.filter((s) => outbox.get(s.jobId.toLowerCase()) !== 1);
    const duplicates = [...outbox].filter(([, n]) => n > 1);
    const strangers = [...summaries].filter((id) => !everySent.has(id) && !enqueuedDirectly.has(id));
    const outboxWithoutSummary = [...outbox.keys()].filter((id) => !summaries.has(id));
    const ran503 = unavailable.filter((s) => summaries.has(s.jobId.toLowerCase()));
    const calls = sent.map(callsOf);
    const failed = sent.filter((s) => s.status !== 202);
    const summary = {
      scenario: name,
      fault: `${result.from} -> ${result.to} settled in ${result.ms} ms`,
      requests: sent.length,
      accepted: accepted.length,
      unavailable: unavailable.length,
      other: other.length,
      firstFailureMs: failed.length > 0 ? Math.min(...failed.map((s) => s.at)) - faultAt : undefined,
      lastFailureMs: failed.length > 0 ? Math.max(...failed.map((s) => s.at + s.ms)) - faultAt : undefined,
      acceptedAfterSettled: accepted.filter((s) => s.at >= settledAt).length,
      jobsDone: accepted.filter((s) => summaries.has(s.jobId.toLowerCase())).length,
      unavailableButRan: ran503.length,
      modelCalls: model.calls - callsBefore,
      jobsCalledMoreThanOnce: calls.filter((n) => n > 1).length,
      mostCallsForOneJob: Math.max(0, ...calls),
      acceptedWithoutSummary: withoutSummary.length,
      acceptedWithoutOneOutboxRow: outboxNotOnce.length,
      duplicates: duplicates.length + strangers.length + outboxWithoutSummary.length,
      deadLetters: await deadLetters(),
      worker: delta(await workerFigures(), figuresBefore),
      drainMs,
      details: [...new Set(failed.map((s) => `${s.status} ${s.detail}`))].slice(0, 5),
    };
    console.log(`${name}: ${JSON.stringify(summary)}`);

    expect(accepted.length).toBeGreaterThan(20);
    expect(other).toEqual([]);
    expect(unclear503).toEqual([]);
    expect(withoutSummary).toEqual([]);
    expect(outboxNotOnce).toEqual([]);
    expect(duplicates).toEqual([]);
    expect(strangers).toEqual([]);
    expect(outboxWithoutSummary).toEqual([]);
    return { result, summary };
  }

  /** Polls (bounded) until each of `jobIds` has its summary and one outbox row; returns how long it took. */
  async function done(jobIds: readonly string[], what: string): Promise<number> {
    const started = Date.now();
    await eventually(
      async () => {
        const { summaries, outbox } = await effects();
        const ids = jobIds.map((id) => id.toLowerCase());
        return ids.every((id) => summaries.has(id) && outbox.get(id) === 1) ? true : undefined;
      },
      DRAIN_MS,
      what,
    );
    return Date.now() - started;
  }

  /**
   * Waits until every worker sits idle in its blocking read of `partition`: its blocking connection for the
   * partition (CLIENT SETNAME `<consumer>:blocking:<partition>`) is blocked in XREADGROUP on the partition's master
   * as it is now (CLIENT LIST there).
   */
  async function blockedOn(partition: number): Promise<void> {
    const names = workers.map((w) => `${w.consumer.consumerName}:blocking:${partition}`);
    let seen = '';
    await eventually(
      async () => {
        const port = await masterOfPartition(partition);
        const list = String(await redisCluster.command(port, 'CLIENT', 'LIST'));
        const blocked = list
          .split('\n')
          .map(
            (line) =>
              new Map(
                line
                  .trim()
                  .split(' ')
                  .map((field) => [field.slice(0, field.indexOf('=')), field.slice(field.indexOf('=') + 1)]),
              ),
          )
          .filter((c) => c.get('cmd') === 'xreadgroup' && (c.get('flags') ?? '').includes('b'))
          .map((c) => c.get('name'));
        seen = `on ${port}: ${blocked.join(', ') || 'none'}`;
        return names.every((name) => blocked.includes(name)) && workers.every((w) => w.consumer.inFlightCount === 0)
          ? true
          : undefined;
      },
      DRAIN_MS,
      `every worker blocked in XREADGROUP for partition ${partition} on its master`,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; blocked in XREADGROUP when last seen ${seen}`);
    });
  }

  /**
   * New jobs into `partition`, enqueued by the test's own producer (the one wire format, on the test's own cluster
   * client, without WAIT) one at a time, each once the workers sit idle in their blocking reads on the partition's
   * master: each must be done, which only blocking connections that found the partition's new master can do.
   */
  async function probeWorkers(partition: number) {
    const queue = new SummaryJobQueue(cluster, streams);
    const jobIds: string[] = [];
    let doneMs = 0;
    for (let i = 0; i < 10; i++) {
      await blockedOn(partition);
      const key = await keyFor(partition);
      const jobId = jobIdOf(key);
      enqueuedDirectly.add(jobId.toLowerCase());
      await queue.enqueue({ jobId, tenant: TENANT_A.tenant, payload: { text: textOf(key), notify: 'p@example.com' } });
      jobIds.push(jobId);
      doneMs = Math.max(doneMs, await done([jobId], `job ${i + 1} enqueued into partition ${partition} to be done`));
    }
    await done(jobIds, `the jobs enqueued into partition ${partition} after the failover to be done`);
    return { enqueued: jobIds.length, doneMs };
  }

  /**
   * New jobs into `partition` through the api, one at a time: their answers, and each written job done before the
   * next is sent.
   */
  async function probeApi(partition: number, avoidPort?: number) {
    const probes: Sent[] = [];
    for (let i = 0; i < 10; i++) {
      const probe = await post(await keyFor(partition, avoidPort));
      probes.push(probe);
      if (probe.status === 202) await done([probe.jobId], `probe ${i + 1} into partition ${partition} to be done`);
    }
    return probes;
  }

  const masterOfPartition = (index: number) => redisCluster.masterOf(keySlot(streams.partitions[index].jobs));

  it('the partitions live on three different masters', async () => {
    const masters = await Promise.all(streams.partitions.map((p) => masterOfPartition(p.index)));
    expect(new Set(masters).size).toBe(PARTITIONS);
  });

  it('a manual failover of partition 0’s master: every 202 has one summary and one notification, no effect twice', async () => {
    const from = await masterOfPartition(0);
    const { result } = await through('manual failover, workers consuming', 0, () => redisCluster.failover(from));
    expect(await masterOfPartition(0)).toBe(result.to);
    // The workers' blocking connections for partition 0 follow its new master: new entries there are done.
    const workersProbe = await probeWorkers(0);
    // The old master is the new one's replica: jobs into partition 0 are accepted again, and done.
    const answers = await probeApi(0);
    const accepted = answers.filter((s) => s.status === 202);
    const apiDoneMs = await done(
      accepted.map((s) => s.jobId),
      'the jobs accepted into partition 0 after the failover to be done',
    );
    console.log(
      `manual failover, after the drain: ${JSON.stringify({
        workersProbe,
        apiProbe: { sent: answers.length, accepted: accepted.length, doneMs: apiDoneMs },
        apiAnswers: [...new Set(answers.map((s) => `${s.status} ${s.detail ?? ''}`.trim()))],
      })}`,
    );
    expect(answers.map((s) => s.status)).toEqual(answers.map(() => 202));
  }, 240_000);

  it('a killed master of another partition: every 202 has one summary and one notification, no effect twice', async () => {
    const victim = streams.partitions.find((p) => p.index !== 0)!.index;
    const from = await masterOfPartition(victim);
    const { result } = await through('killed master, workers consuming', victim, () => redisCluster.killMaster(from));
    expect(await masterOfPartition(victim)).toBe(result.to);
    const workersProbe = await probeWorkers(victim);
    // The promoted replica has no replica of its own: with REDIS_DURABILITY=replica (the default) it still takes
    // jobs, each written without a replica and counted; each runs once.
    const answers = await probeApi(victim, result.to);
    expect(answers.map((s) => s.status)).toEqual(answers.map(() => 202));
    const apiDoneMs = await done(
      answers.map((s) => s.jobId),
      `the jobs accepted into partition ${victim} after the kill to be done`,
    );
    console.log(
      `killed master, after the drain: ${JSON.stringify({ workersProbe, apiProbe: { sent: answers.length, doneMs: apiDoneMs } })}`,
    );
  }, 240_000);
});
