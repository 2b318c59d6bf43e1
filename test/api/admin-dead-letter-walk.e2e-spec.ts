import { AdminActionCounts, OperationsService } from '@app/operations';
import { OutboxAdminRepository } from '@app/persistence';
import {
  DeadLetterQueue,
  type DeadLetterScanSettings,
  fieldsOf,
  operatedQueues,
  SummaryStreams,
} from '@app/summary-queue';
import type { OperatedQueues, OtherQueue } from '@app/workflows';
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { freshRedis, testDataSource } from '../support/infra';

/*
 * The dead-letter walk against Redis itself, with every queue and
 * JOB_STREAM_PARTITIONS=2: the order across queues and partitions, the
 * cursor on each member of a tie, and the bounds of a filtered scan and of a
 * bulk re-drive, with the read batch made small so that a walk crosses it.
 */
describe('walking the dead letters of every queue and partition', () => {
  let redis: Redis;
  let db: DataSource;

  beforeAll(async () => {
    // Each re-drive logs a line: not this suite's subject.
    Logger.overrideLogger(false);
    db = await testDataSource();
  });
  afterAll(() => db.destroy());
  beforeEach(async () => {
    redis = await freshRedis();
  });
  afterEach(() => redis.disconnect());

  const queuesOf = (partitions: number, others?: readonly OtherQueue[]) =>
    operatedQueues(new SummaryStreams(partitions), others);
  /** The dead-letter stream of queue `q` (0 summaries, 1 workflows, ...), partition `p`. */
  const dead = (queues: OperatedQueues, q: number, p: number) => queues.all[q].layout.partitions[p].dead;
  const letter = (workflow?: string, jobId: string = randomUUID()) => [
    'job_id',
    jobId,
    'tenant',
    'tenant-a',
    'payload',
    '{"text":"x"}',
    ...(workflow ? ['workflow', workflow, 'step', 'draft'] : []),
    'reason',
    'llm_client',
    'detail',
    '400',
    'source_id',
    '1-0',
  ];
  const ids = (letters: readonly { id: string }[]) => letters.map((l) => l.id);
  const operations = (deadLetters: DeadLetterQueue, queues: OperatedQueues) =>
    new OperationsService(
      deadLetters,
      new OutboxAdminRepository(),
      db,
      new AdminActionCounts(redis, queues),
      queues,
      redis,
    );

  describe('with two partitions and ties across queues and partitions', () => {
    const queues = queuesOf(2);
    // In the list's order: by id, ties by queue (summaries, workflows), then partition.
    const expected = [
      'workflows/1:4-0',
      '0:5-0',
      '1:5-0',
      'workflows/0:5-0',
      'workflows/1:5-0',
      '1:6-0',
      'workflows/0:6-1',
    ];
    beforeEach(async () => {
      await redis.xadd(dead(queues, 1, 1), '4-0', ...letter('triage'));
      for (const [q, p] of [
        [1, 1],
        [0, 1],
        [1, 0],
        [0, 0],
      ])
        await redis.xadd(dead(queues, q, p), '5-0', ...letter(q === 1 ? 'triage' : undefined));
      await redis.xadd(dead(queues, 0, 1), '6-0', ...letter());
      await redis.xadd(dead(queues, 1, 0), '6-1', ...letter('triage'));
    });

    it.each([
      ['the default read batch', {}],
      ['a read batch of one', { batch: 1 }],
      ['a read batch of two', { batch: 2 }],
    ])('lists them in order with %s, and pages one at a time through every tie', async (_, settings) => {
      const deadLetters = new DeadLetterQueue(redis, queues, settings);
      expect(ids((await deadLetters.list(50)).letters)).toEqual(expected);
      const paged: string[] = [];
      let after: string | undefined;
      for (;;) {
        const page = await deadLetters.list(1, after);
        paged.push(...ids(page.letters));
        if (page.next === undefined) break;
        expect(page.next).toBe(page.letters[0].id);
        after = page.next;
      }
      expect(paged).toEqual(expected);
    });

    it('resumes after each member of a tie with exactly those after it', async () => {
      const deadLetters = new DeadLetterQueue(redis, queues, { batch: 2 });
      for (const [i, id] of expected.entries()) {
        const page = await deadLetters.list(50, id);
        expect({ after: id, ids: ids(page.letters), next: page.next }).toEqual({
          after: id,
          ids: expected.slice(i + 1),
          next: undefined,
        });
      }
    });

    it('re-drives each into its own queue and partition, across calls of one dead letter each', async () => {
      const deadLetters = new DeadLetterQueue(redis, queues, { batch: 1 });
      const ops = operations(deadLetters, queues);
      const nexts: (string | undefined)[] = [];
      let after: string | undefined;
      let redriven = 0;
      do {
        const part = await ops.redriveAll('admin-cli', { limit: 1, after });
        redriven += part.redriven;
        nexts.push(part.next);
        after = part.next;
      } while (after !== undefined);
      expect(nexts).toEqual([...expected.slice(0, -1), undefined]);
      expect(redriven).toBe(expected.length);
      const jobs = (q: number, p: number) => redis.xlen(queues.all[q].layout.partitions[p].jobs);
      expect([await jobs(0, 0), await jobs(0, 1), await jobs(1, 0), await jobs(1, 1)]).toEqual([1, 2, 2, 2]);
    });
  });

  describe('a filter, read inside each dead letter', () => {
    const queues = queuesOf(2);
    // Twelve dead letters, 1-0 to 12-0, alternating partitions of the workflows queue; three of triage.
    const triageAt = [2, 9, 11];
    const streamOf = (i: number) => dead(queues, 1, i % 2);
    beforeEach(async () => {
      for (let i = 1; i <= 12; i++)
        await redis.xadd(streamOf(i), `${i}-0`, ...letter(triageAt.includes(i) ? 'triage' : 'onboarding'));
    });
    const id = (i: number) => `workflows/${i % 2}:${i}-0`;
    const settings: DeadLetterScanSettings = { batch: 2, listExamine: 5 };

    it('looks at a bounded number per page, across read batches, and answers where it stopped even on no match', async () => {
      const deadLetters = new DeadLetterQueue(redis, queues, settings);
      const filter = { workflow: 'triage' };
      const first = await deadLetters.list(3, undefined, filter);
      expect({ ids: ids(first.letters), next: first.next }).toEqual({ ids: [id(2)], next: id(5) });
      const second = await deadLetters.list(3, first.next, filter);
      expect({ ids: ids(second.letters), next: second.next }).toEqual({ ids: [id(9)], next: id(10) });
      const third = await deadLetters.list(3, second.next, filter);
      expect({ ids: ids(third.letters), next: third.next }).toEqual({ ids: [id(11)], next: undefined });
      // A page of nothing but other workflows still moves on.
      const none = await deadLetters.list(1, id(2), filter);
      expect({ ids: ids(none.letters), next: none.next }).toEqual({ ids: [], next: id(7) });
    });

    it('reads each stream once for a whole walk, and counts one workflow reading each stream once', async () => {
      const deadLetters = new DeadLetterQueue(redis, queues, settings);
      const xrange = jest.spyOn(redis, 'xrange');
      const all = await deadLetters.scan({ examine: 100, filter: { workflow: 'triage' } });
      expect(ids(all.letters)).toEqual(triageAt.map(id));
      // Per stream, six entries in batches of two: three full reads and a short one; the empty streams, one each.
      const readsOf = (key: string) => xrange.mock.calls.filter(([k]) => k === key).length;
      const reads = () => [0, 1].flatMap((q) => [0, 1].map((p) => readsOf(dead(queues, q, p))));
      expect(reads()).toEqual([1, 1, 4, 4]);
      xrange.mockClear();
      expect(await deadLetters.length({ workflow: 'triage' })).toBe(3);
      expect(reads()).toEqual([1, 1, 4, 4]);
      xrange.mockRestore();
    });

    it('a bulk re-drive looks at `limit` dead letters of any workflow per call, and says where it stopped', async () => {
      const ops = operations(new DeadLetterQueue(redis, queues, settings), queues);
      const first = await ops.redriveAll('admin-api', { limit: 4, workflow: 'triage' });
      expect(first).toEqual({ redriven: 1, notRedrivable: [], next: id(4) });
      const second = await ops.redriveAll('admin-api', { limit: 4, after: first.next, workflow: 'triage' });
      expect(second).toEqual({ redriven: 0, notRedrivable: [], next: id(8) });
      const third = await ops.redriveAll('admin-api', { limit: 4, after: second.next, workflow: 'triage' });
      expect(third).toEqual({ redriven: 2, notRedrivable: [] });
      const jobs = await Promise.all(queues.all[1].layout.partitions.map((p) => redis.xrange(p.jobs, '-', '+')));
      expect(jobs.flat().map(([, f]) => fieldsOf(f).workflow)).toEqual(['triage', 'triage', 'triage']);
      expect((await redis.xlen(streamOf(0))) + (await redis.xlen(streamOf(1)))).toBe(9);
    });
  });

  it('stops a re-drive of every dead letter at the newest as it began: one that fails again at once waits', async () => {
    const queues = queuesOf(1);
    const ops = operations(new DeadLetterQueue(redis, queues, { batch: 1 }), queues);
    const wfDead = dead(queues, 1, 0);
    const runs = [randomUUID(), randomUUID(), randomUUID()];
    for (const run of runs) await redis.xadd(wfDead, '*', ...letter('triage', run));

    const until = await ops.deadLetterBounds();
    const first = await ops.redriveAll('admin-cli', { limit: 1, until });
    expect(first).toMatchObject({ redriven: 1, next: expect.any(String) });
    // The re-driven run fails again at once: the worker dead-letters it anew, after the walk's end.
    const [[, again]] = await redis.xrange(queues.all[1].layout.partitions[0].jobs, '-', '+');
    await redis.xadd(wfDead, '*', ...letter('triage', fieldsOf(again).job_id));

    const rest = await ops.redriveAll('admin-cli', { after: first.next, until });
    expect(rest).toEqual({ redriven: 2, notRedrivable: [] });
    const left = await redis.xrange(wfDead, '-', '+');
    expect(left.map(([, f]) => fieldsOf(f).job_id)).toEqual([runs[0]]);
  });

  it('gives a dead letter of a queue of its own that queue’s workflow, and the shared queue’s records none', async () => {
    const queues = queuesOf(1, [
      { name: 'workflows', group: 'workflows' },
      { name: 'mail', group: 'mailers', workflow: 'onboarding' },
    ]);
    const deadLetters = new DeadLetterQueue(redis, queues);
    await redis.xadd(dead(queues, 2, 0), '1-0', ...letter());
    await redis.xadd(dead(queues, 1, 0), '2-0', 'reason', 'deleted_from_stream', 'source_id', '9-0');
    await redis.xadd(dead(queues, 0, 0), '3-0', ...letter());
    const all = (await deadLetters.list()).letters;
    expect(all.map((l) => [l.id, l.queue, l.workflow])).toEqual([
      ['mail/1-0', 'mail', 'onboarding'],
      ['workflows/2-0', 'workflows', 'workflows'],
      ['3-0', 'summaries', 'summaries'],
    ]);
    expect(ids((await deadLetters.list(50, undefined, { workflow: 'onboarding' })).letters)).toEqual(['mail/1-0']);
    expect(await deadLetters.length({ workflow: 'onboarding' })).toBe(1);
    const redriven = await deadLetters.redrive('mail/1-0');
    expect(redriven).toMatchObject({ outcome: 'redriven', deadLetter: 'mail/1-0', workflow: 'onboarding' });
  });
});
