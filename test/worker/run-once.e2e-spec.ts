import { CONSUMER_GROUP, jobIdFor, partitionOf, SummaryJobQueue, SummaryStreams } from '@app/summary-queue';
import { QueueLayout, SlotLimiter, stepEntryFields, WORKFLOWS_GROUP, WORKFLOWS_QUEUE } from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { type ModelReply, FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * StreamsConsumer.runOnce with several partitions: its turns run side by side,
 * each within its part of the slots free when it began (runOnceShares), so no
 * turn waits on the jobs another turn started; and a turn still waiting for a
 * slot when the consumer stops returns at once.
 */
describe('runOnce over several partitions', () => {
  const PARTITIONS = 3;
  const streams = new SummaryStreams(PARTITIONS);
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let worker: WorkerHarness | undefined;
  /** The model's calls held until the test lets them answer. */
  let held: (() => void)[];

  /** A job whose id lands in `partition` (of `of`), its text naming that partition (what the model sees). */
  const jobIn = (partition: number, of = PARTITIONS) => {
    for (;;) {
      const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
      if (partitionOf(jobId, of) === partition)
        return { jobId, tenant: 'tenant-a', payload: { text: `partition ${partition}`, notify: 'a@b.c' } };
    }
  };
  /** A triage run id whose entry lands in `partition` of the `workflows` queue. */
  const runIn = (partition: number) => {
    for (;;) {
      const runId = jobIdFor(`tenant-a:POST:/v1/triage:${randomUUID()}`);
      if (partitionOf(runId, PARTITIONS) === partition) return runId;
    }
  };
  const start = async (concurrency: number, partitions: number) => {
    worker = await startWorker({
      modelUrl: model.baseUrl,
      env: { JOB_STREAM_PARTITIONS: String(partitions), WORKER_CONCURRENCY: String(concurrency) },
    });
    return worker;
  };
  const calls = (n: number) => eventually(() => (model.calls >= n ? true : undefined), 10_000, `${n} model call(s)`);

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
  });
  afterAll(async () => {
    await model?.stop();
    await db?.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    model.requests.length = 0;
    held = [];
    model.reply = () =>
      new Promise<ModelReply>((resolve) => held.push(() => resolve({ kind: 'complete', content: 'Summed up.' })));
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    for (const release of held.splice(0)) release();
    await worker?.close();
    worker = undefined;
    redis.disconnect();
  });

  /*
   * WORKER_CONCURRENCY 8; the worker's two queues (summaries, and triage's
   * `workflows`) with three partitions each: six turns. Two entries in every
   * partition, every model call held. Shared as 3/1/1/1/1/1, the first wave
   * reads from every partition. (Before, each turn reserved up to
   * ceil(8/6) = 2: four turns took the eight slots and two partitions waited
   * for their jobs to end.)
   */
  it('shares the free slots among the partitions: the first wave reads from every partition', async () => {
    const w = await start(8, PARTITIONS);
    const summaries = new SummaryJobQueue(redis, streams);
    const workflows = new QueueLayout(WORKFLOWS_QUEUE, PARTITIONS);
    for (let partition = 0; partition < PARTITIONS; partition++)
      for (let i = 0; i < 2; i++) {
        await summaries.enqueue(jobIn(partition));
        const runId = runIn(partition);
        const payload = JSON.stringify({ ticket_id: 'T-1', text: 'Where is my invoice?', notify: 'agent@example.com' });
        const entry = stepEntryFields({ runId, tenant: 'tenant-a', payload, workflow: 'triage' });
        await redis.xadd(workflows.at(partition)!.jobs, '*', ...entry);
      }
    const streamsRead = [
      ...streams.partitions.map((p) => [p.jobs, CONSUMER_GROUP]),
      ...workflows.partitions.map((p) => [p.jobs, WORKFLOWS_GROUP]),
    ];
    const once = w.consumer.runOnce();
    // Every partition has an entry read (pending) while the first wave's calls are held.
    await eventually(
      async () => {
        const pending = await Promise.all(
          // Before the turn made its group: nothing read there yet.
          streamsRead.map(([stream, group]) =>
            redis.xpending(stream, group).then(
              (summary) => Number((summary as [number])[0]),
              () => 0,
            ),
          ),
        );
        return pending.every((n) => n > 0) ? pending : undefined;
      },
      10_000,
      'an entry read in every partition',
    );
    await calls(7);
    for (const release of held.splice(0)) release();
    // The first turn's share (3) covers both of its entries; every other turn read one.
    expect((await once).map((d) => d.outcome)).toEqual(Array(7).fill('done'));
  });

  /*
   * WORKER_CONCURRENCY 1, two partitions, a job in each: one turn runs its job
   * (held), the other waits for the slot. The consumer stops: the waiting turn
   * returns at once, without one more wait for a slot (before, it waited up to
   * a second more after the stop woke it).
   */
  it('a turn waiting for a slot when the consumer stops returns without waiting again', async () => {
    const w = await start(1, 2);
    const two = new SummaryStreams(2);
    const queue = new SummaryJobQueue(redis, two);
    for (const partition of [0, 1]) await queue.enqueue(jobIn(partition, 2));
    const waits: boolean[] = [];
    let stopping = false;
    const slotFreed = SlotLimiter.prototype.slotFreed;
    jest.spyOn(SlotLimiter.prototype, 'slotFreed').mockImplementation(function (this: SlotLimiter<unknown>, ms) {
      waits.push(stopping);
      return slotFreed.call(this, ms);
    });
    const once = w.consumer.runOnce();
    await calls(1);
    // The other turn is waiting for the slot.
    await eventually(() => (waits.length > 0 ? true : undefined), 10_000, 'a turn waiting for a slot');
    stopping = true;
    const stopped = w.consumer.stop();
    for (const release of held.splice(0)) release();
    await stopped;
    expect((await once).map((d) => d.outcome)).toEqual(['done']);
    expect(waits).not.toContain(true);
    expect(model.calls).toBe(1);
    // The job the waiting turn never read is still in its stream, for the next worker.
    expect((await Promise.all(two.partitions.map((p) => redis.xlen(p.jobs)))).sort()).toEqual([0, 1]);
  });
});
