import { jobIdFor, partitionOf, SummaryJobQueue, SummaryStreams } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * More partitions than slots (JOB_STREAM_PARTITIONS 4, WORKER_CONCURRENCY 2):
 * the idle partitions' loops each hold a slot while they block, so two of
 * them can read at a time. Before the loops took turns, the two that first
 * got a slot took it again each time their block ended, and a job in either
 * other partition was never read while the stream stayed otherwise idle.
 */
describe('partitions that outnumber the slots all get read', () => {
  const PARTITIONS = 4;
  const streams = new SummaryStreams(PARTITIONS);
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let worker: WorkerHarness;

  beforeAll(async () => {
    db = await testDataSource();
    redis = await freshRedis();
    await truncateAll(db);
    model = await new FakeOpenAiServer().start();
    worker = await startWorker({
      modelUrl: model.baseUrl,
      env: { JOB_STREAM_PARTITIONS: String(PARTITIONS), WORKER_CONCURRENCY: '2' },
      consumer: { autoStart: true, blockMs: 1000 },
    });
  });
  afterAll(async () => {
    await worker?.close();
    await model?.stop();
    redis?.disconnect();
    await db?.destroy();
  });

  /** A job whose id lands in `partition`. */
  const jobIn = (partition: number) => {
    for (;;) {
      const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
      if (partitionOf(jobId, PARTITIONS) === partition)
        return { jobId, tenant: 'tenant-a', payload: { text: 'Read me, whichever partition.', notify: 'a@b.c' } };
    }
  };
  /**
   * Waits until every partition's loop, of each queue, is blocked in its read (CLIENT LIST: its blocking connection
   * in XREADGROUP, flag b): the loops have settled with the stream idle.
   */
  const settled = () =>
    eventually(
      async () => {
        const clients = ((await redis.client('LIST')) as string)
          .split('\n')
          .filter(Boolean)
          .map((line) => Object.fromEntries(line.split(' ').map((kv) => kv.split('=', 2))) as Record<string, string>);
        const loops = clients.filter(
          (c) => c.name?.startsWith(`${worker.consumer.consumerName}:`) && c.name.includes(':blocking:'),
        );
        // Two queues (summaries, workflows), each with PARTITIONS loops.
        const blocked = loops.filter((c) => c.cmd === 'xreadgroup' && c.flags.includes('b'));
        return loops.length === 2 * PARTITIONS && blocked.length === loops.length ? true : undefined;
      },
      15_000,
      'every loop blocked in its read',
    );
  const done = async (jobId: string) =>
    Number((await db.query('SELECT count(*) AS n FROM summaries WHERE job_id = $1', [jobId]))[0].n) === 1;

  it('a job enqueued into one partition after another, the stream idle in between, is done every time', async () => {
    const queue = new SummaryJobQueue(redis, streams);
    for (const partition of [3, 2, 1, 0, 2, 3]) {
      // Idle long enough for the loops to have settled into their blocking reads.
      await settled();
      const job = jobIn(partition);
      await queue.enqueue(job);
      await eventually(
        async () => ((await done(job.jobId)) ? true : undefined),
        15_000,
        `the job in partition ${partition}`,
      );
    }
    expect(Number((await db.query('SELECT count(*) AS n FROM summaries'))[0].n)).toBe(6);
    for (const p of streams.partitions) expect(await redis.xlen(p.jobs)).toBe(0);
  });
});
