import {
  CONSUMER_GROUP,
  DEAD_LETTER_STREAM,
  fieldsOf,
  jobIdFor,
  jobRecordKey,
  JOBS_STREAM,
  summaryReadyDedupeKey,
  SummaryJobQueue,
} from '@app/summary-queue';
import { SummaryWriter } from '@app/persistence';
import { type ChainableCommander, Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { Logger } from '@nestjs/common';
import { ConsumerGroup } from '../../libs/workflows/src/consumer/consumer-group';
import { ACK } from '../../libs/workflows/src/consumer/stream-scripts';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import {
  eventually,
  freePort,
  freshRedis,
  type RedisServer,
  startRedisServer,
  testDataSource,
  truncateAll,
} from '../support/infra';
import { idlePast as idleAtLeast } from '../support/pending-entries';
import { metricSample, metricValue } from '../support/metrics';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

const newJob = (text = 'Redis Streams deliver at least once. The worker makes each effect happen once.') => ({
  jobId: jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`),
  tenant: 'tenant-a',
  payload: { text, notify: 'someone@example.com' },
});

describe('StreamsConsumer against real Redis and PostgreSQL', () => {
  let redis: Redis;
  let db: DataSource;
  let queue: SummaryJobQueue;
  let model: FakeOpenAiServer;
  const workers: WorkerHarness[] = [];

  const worker = async (env: Record<string, string> = {}, consumer = {}) => {
    const w = await startWorker({ modelUrl: model.baseUrl, env, consumer });
    workers.push(w);
    return w;
  };
  const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`))[0].n);
  const pending = async () => Number(((await redis.xpending(JOBS_STREAM, CONSUMER_GROUP)) as [number])[0]);
  /** What a consumer that then dies leaves behind: the entry delivered to it and never acknowledged. */
  const readAs = async (consumer: string, count = 10) => {
    const reply = (await redis.xreadgroup(
      'GROUP',
      CONSUMER_GROUP,
      consumer,
      'COUNT',
      count,
      'STREAMS',
      JOBS_STREAM,
      '>',
    )) as [string, [string, string[]][]][] | null;
    return (reply?.[0]?.[1] ?? []).map(([id, flat]) => ({ id, fields: fieldsOf(flat) }));
  };
  const createGroup = () => redis.xgroup('CREATE', JOBS_STREAM, CONSUMER_GROUP, '0', 'MKSTREAM');
  /** XPENDING's detail: [id, consumer, deliveries] of each pending entry. */
  const pendingEntries = async (client = redis) =>
    ((await client.xpending(JOBS_STREAM, CONSUMER_GROUP, '-', '+', 100)) as [string, string, number, number][]).map(
      ([id, consumer, , deliveries]): [string, string, number] => [id, consumer, deliveries],
    );
  /**
   * Sets how long `ids`, pending for `consumer`, have been idle (XCLAIM ... IDLE JUSTID: no delivery counted), as if
   * that much time had passed since their delivery: the tests reason about CLAIM_IDLE_MS without waiting it out, so
   * a slow machine cannot make an entry claimable before the test says it is.
   */
  const idleFor = (consumer: string, ids: readonly string[], ms: number) =>
    redis.call('XCLAIM', JOBS_STREAM, CONSUMER_GROUP, consumer, 0, ...ids, 'IDLE', ms, 'JUSTID');
  /** Until every entry pending in the group (on `client`'s server) is claimable by a CLAIM_IDLE_MS of `ms`. */
  const idlePast = (ms: number, client: Redis = redis) => idleAtLeast(client, JOBS_STREAM, CONSUMER_GROUP, ms);
  /** Redis's clock, in ms: the one XAUTOCLAIM measures idle times on. */
  const redisNow = async () => {
    const [s, us] = await redis.time();
    return Number(s) * 1000 + Number(us) / 1000;
  };
  const consumerNames = async () =>
    ((await redis.xinfo('CONSUMERS', JOBS_STREAM, CONSUMER_GROUP)) as string[][]).map((c) => fieldsOf(c).name).sort();

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
  });
  afterAll(async () => {
    await model.stop();
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    queue = new SummaryJobQueue(redis);
    await truncateAll(db);
    model.requests.length = 0;
    model.peakConcurrency = 0;
    model.reply = () => ({ kind: 'complete', content: 'A short summary.' });
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    await Promise.all(workers.splice(0).map((w) => w.close()));
    redis.disconnect();
  });

  it('runs a job end to end: one model call, the summary and its outbox row, the entry acknowledged and gone', async () => {
    const w = await worker();
    const job = newJob();
    await queue.enqueue(job);
    expect(await w.consumer.runOnce()).toEqual([expect.objectContaining({ deliveries: 1, outcome: 'done' })]);
    expect(model.calls).toBe(1);
    expect(model.requests[0].userText).toBe(job.payload.text);
    expect(model.requests[0].model).toBe('gpt-4.1-mini');
    expect(await db.query('SELECT job_id, tenant, summary FROM summaries')).toEqual([
      { job_id: job.jobId, tenant: 'tenant-a', summary: 'A short summary.' },
    ]);
    expect(await db.query('SELECT dedupe_key, payload FROM outbox')).toEqual([
      { dedupe_key: summaryReadyDedupeKey(job.jobId), payload: { job_id: job.jobId, to: 'someone@example.com' } },
    ]);
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });

  it('the same job id enqueued twice: one summary, one outbox row, both entries acknowledged', async () => {
    const w = await worker();
    const job = newJob();
    await queue.enqueue(job);
    await queue.enqueue(job);
    const outcomes = (await w.consumer.runOnce()).map((r) => r.outcome).sort();
    expect(outcomes).toEqual(['done', 'duplicate']);
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
    expect(await pending()).toBe(0);
    // and a later delivery of it is stopped by the pre-check, without a model call
    const calls = model.calls;
    await queue.enqueue(job);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['duplicate']);
    expect(model.calls).toBe(calls);
  });

  it('a batch read together is pre-checked in one query: the stored job is stopped without a model call', async () => {
    const w = await worker();
    const writer = w.app.get(SummaryWriter);
    const done = newJob();
    await queue.enqueue(done);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    const calls = model.calls;
    // Spies that pass through to the real queries: how many go to PostgreSQL, and with what.
    const batch = jest.spyOn(writer, 'storedAmong');
    const single = jest.spyOn(writer, 'isStored');
    const fresh = [newJob(), newJob()];
    for (const job of [fresh[0], done, fresh[1]]) await queue.enqueue(job);
    expect((await w.consumer.runOnce()).map((r) => r.outcome).sort()).toEqual(['done', 'done', 'duplicate']);
    expect(batch).toHaveBeenCalledTimes(1);
    expect([...batch.mock.calls[0][0]].sort()).toEqual([fresh[0].jobId, done.jobId, fresh[1].jobId].sort());
    expect(single).not.toHaveBeenCalled();
    expect(model.calls).toBe(calls + 2);
    expect(await count('summaries')).toBe(3);
    expect(await count('outbox')).toBe(3);
  });

  it('every finished job is written and acked through the batched write and the batched ack', async () => {
    const w = await worker();
    await createGroup();
    // Pass-through spies: the statements and the script still run against PostgreSQL and Redis.
    const query = jest.spyOn(w.dataSource, 'query');
    const ack = jest.spyOn(ACK, 'run');
    const jobs = [newJob(), newJob(), newJob(), newJob()];
    for (const job of jobs) await queue.enqueue(job);
    const ran = await w.consumer.runOnce();
    expect(ran.map((r) => r.outcome)).toEqual(['done', 'done', 'done', 'done']);
    // How the jobs split into statements depends on when the model's answers arrive; each is in exactly one.
    const written = query.mock.calls
      .filter(([sql]) => sql.includes('INSERT INTO "summaries"'))
      .flatMap(([, params]) => (params as string[][])[0]);
    expect(written.sort()).toEqual(jobs.map((j) => j.jobId).sort());
    const acked = ack.mock.calls.flatMap(([, , args]) => (args as string[]).slice(1));
    expect(acked.sort()).toEqual(ran.map((r) => r.id).sort());
    expect(await count('summaries')).toBe(4);
    expect(await count('outbox')).toBe(4);
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });

  it('ConsumerGroup: acks asked for in one turn go to Redis as one script call', async () => {
    const group = new ConsumerGroup(
      redis,
      {
        stream: JOBS_STREAM,
        deadLetterStream: DEAD_LETTER_STREAM,
        group: CONSUMER_GROUP,
        consumer: 'c1',
        claimIdleMs: 60_000,
        blockMs: 100,
      },
      new Logger('test'),
    );
    await group.ensure();
    for (let i = 0; i < 5; i++) await queue.enqueue(newJob());
    const read = await group.readNew(10, false);
    expect(read).toHaveLength(5);
    const ack = jest.spyOn(ACK, 'run');
    await Promise.all(read.map((m) => group.ack(m.id)));
    expect(ack).toHaveBeenCalledTimes(1);
    expect(ack.mock.calls[0][2]).toEqual([CONSUMER_GROUP, ...read.map((m) => m.id)]);
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });

  it('a batch pre-check that fails: each delivery checks on its own, and the outcome is the same', async () => {
    const w = await worker();
    const writer = w.app.get(SummaryWriter);
    const done = newJob();
    await queue.enqueue(done);
    await w.consumer.runOnce();
    const calls = model.calls;
    // Fault injection around the real writer: the batch query fails once.
    jest.spyOn(writer, 'storedAmong').mockRejectedValueOnce(new Error('connection reset'));
    const single = jest.spyOn(writer, 'isStored');
    const fresh = newJob();
    await queue.enqueue(done);
    await queue.enqueue(fresh);
    expect((await w.consumer.runOnce()).map((r) => r.outcome).sort()).toEqual(['done', 'duplicate']);
    expect(single).toHaveBeenCalledTimes(2);
    expect(model.calls).toBe(calls + 1);
    expect(await count('summaries')).toBe(2);
  });

  it('crash between commit and XACK: another worker reclaims it; one model call, one summary, one outbox row', async () => {
    // A minute: however long A's run takes on a slow machine, the entry is not idle long enough for B before the
    // test makes it so. B scans the pending entries at every turn (its interval would be 5 s).
    const a = await worker({ CLAIM_IDLE_MS: '60000' });
    const b = await worker({ CLAIM_IDLE_MS: '60000' }, { reclaimIntervalMs: 0 });
    const job = newJob();
    await queue.enqueue(job);
    await createGroup();
    // Worker A reads and runs the job to its commit, then dies before XACK.
    const [entry] = await readAs('worker-a-dead');
    await expect(
      a.handler.handle(job, {
        deadline: performance.now() + 10_000,
        stopRetrying: new AbortController().signal,
        signal: new AbortController().signal,
      }),
    ).resolves.toBe('done');
    expect(await pending()).toBe(1);

    expect(await b.consumer.runOnce()).toEqual([]); // not idle long enough yet
    await idleFor('worker-a-dead', [entry.id], 61_000); // a minute and a second since A's delivery
    const results = await b.consumer.runOnce();
    expect(results).toEqual([{ id: entry.id, deliveries: 2, outcome: 'duplicate' }]);
    expect(model.calls).toBe(1);
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
    expect(await pending()).toBe(0);
  });

  it('a slow worker and a reclaimer on the same job at once: done and duplicate, two model calls, one outbox row', async () => {
    const a = await worker({ CLAIM_IDLE_MS: '200' });
    const b = await worker({ CLAIM_IDLE_MS: '200' });
    // The model answers neither call before both have come: B's run starts while A's is still at the model, however
    // slow the machine. (B not calling the model at all leaves A's call to its 10 s deadline: transient, a failure.)
    const bothCalled = Promise.withResolvers<void>();
    model.reply = async (n) => {
      if (n === 2) bothCalled.resolve();
      await bothCalled.promise;
      return { kind: 'complete', content: 'Slowly summarised.' };
    };
    const job = newJob();
    await queue.enqueue(job);
    await createGroup();
    await readAs('slow-worker'); // A holds it but does not refresh it (stalled)
    const slow = a.handler.handle(job, {
      deadline: performance.now() + 10_000,
      stopRetrying: new AbortController().signal,
      signal: new AbortController().signal,
    });
    await idlePast(200); // past CLAIM_IDLE_MS
    const reclaimed = b.consumer.runOnce();
    const [first, [second]] = await Promise.all([slow, reclaimed]);
    expect([first, second.outcome].sort()).toEqual(['done', 'duplicate']);
    expect(second.deliveries).toBe(2);
    expect(model.calls).toBe(2);
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
  });

  it('a consumer killed after XREADGROUP: not claimable before CLAIM_IDLE_MS, then claimed with delivery count 2', async () => {
    // Scanning the pending entries at every turn (its interval would be 5 s).
    const b = await worker({ CLAIM_IDLE_MS: '60000' }, { reclaimIntervalMs: 0 });
    await queue.enqueue(newJob());
    await createGroup();
    const [entry] = await readAs('killed-consumer');
    // Five seconds short of CLAIM_IDLE_MS: only a stall of five seconds before the claim could make it claimable.
    await idleFor('killed-consumer', [entry.id], 55_000);
    expect(await b.consumer.runOnce()).toEqual([]);
    const [[, owner, , deliveriesBefore]] = (await redis.xpending(JOBS_STREAM, CONSUMER_GROUP, '-', '+', 10)) as [
      string,
      string,
      number,
      number,
    ][];
    expect([owner, deliveriesBefore]).toEqual(['killed-consumer', 1]);
    await idleFor('killed-consumer', [entry.id], 61_000); // a second past it
    expect(await b.consumer.runOnce()).toEqual([{ id: entry.id, deliveries: 2, outcome: 'done' }]);
    expect(model.calls).toBe(1);
  });

  it('a live worker whose job runs three times CLAIM_IDLE_MS keeps it: nobody else claims it, one model call', async () => {
    // A refreshes every 25 ms what lapses after 500: only a stall of nearly half a second could let B in.
    const a = await worker({ CLAIM_IDLE_MS: '500' }, { refreshIntervalMs: 25 });
    const b = await worker({ CLAIM_IDLE_MS: '500' });
    // A's job runs until the test has looked for 1.5 s (three times CLAIM_IDLE_MS), however slow the machine; a
    // second call (B's, had it taken the job) is answered at once.
    const answer = Promise.withResolvers<void>();
    model.reply = async (n) => {
      if (n === 1) await answer.promise;
      return { kind: 'complete', content: 'Took a while.' };
    };
    const id = await queue.enqueue(newJob());
    const running = a.consumer.runOnce();
    await eventually(() => (model.calls === 1 ? true : undefined), 5000, 'the model call');
    // A's delivery came before its model call: B looks until Redis's clock (XAUTOCLAIM's) is three CLAIM_IDLE_MS
    // past it, so an entry A did not refresh would have been claimable at B's later looks.
    const since = await redisNow();
    const stolen: unknown[] = [];
    const counted: number[] = [];
    await eventually(
      async () => {
        stolen.push(...(await b.consumer.runOnce()));
        for (const [pendingId, , deliveries] of await pendingEntries()) if (pendingId === id) counted.push(deliveries);
        return (await redisNow()) - since > 1500 ? true : undefined;
      },
      20_000,
      'B looking for three CLAIM_IDLE_MS',
    );
    answer.resolve();
    expect(stolen).toEqual([]);
    // Pending for A at every look; refreshes (XCLAIM ... JUSTID) reset the idle time without counting a delivery.
    expect(counted.length).toBeGreaterThan(0);
    expect(counted).toEqual(Array(counted.length).fill(1));
    expect(await running).toEqual([expect.objectContaining({ deliveries: 1, outcome: 'done' })]);
    expect(model.calls).toBe(1);
    expect(await count('outbox')).toBe(1);
  });

  it('an always-failing transient job with MAX_DELIVERIES=3 runs 3 times; the 4th claim dead-letters it', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '200', MAX_DELIVERIES: '3', LLM_MAX_ATTEMPTS: '1' });
    model.reply = () => ({ kind: 'error', status: 503 });
    const job = newJob();
    const sourceId = await queue.enqueue(job);
    const outcomes: [number, string][] = [];
    for (let i = 0; i < 4; i++) {
      if (i > 0) await idlePast(200); // the failed delivery's entry is claimable again
      outcomes.push(...(await w.consumer.runOnce()).map((r): [number, string] => [r.deliveries, r.outcome]));
    }
    expect(outcomes).toEqual([
      [1, 'transient'],
      [2, 'transient'],
      [3, 'transient'],
    ]);
    expect(model.calls).toBe(3);
    const dead = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(dead).toHaveLength(1);
    expect(fieldsOf(dead[0][1])).toEqual({
      job_id: job.jobId,
      tenant: 'tenant-a',
      payload: JSON.stringify(job.payload),
      reason: 'max_deliveries',
      detail: 'delivered 3 times without success',
      source_id: sourceId,
    });
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
    expect(await redis.hgetall(jobRecordKey(job.jobId))).toMatchObject({ status: 'failed', error: 'max_deliveries' });
  });

  it('a 400 from the model is dead-lettered after exactly one model call', async () => {
    const w = await worker();
    model.reply = () => ({ kind: 'error', status: 400 });
    const job = newJob();
    await queue.enqueue(job);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(model.calls).toBe(1);
    const [[, fields]] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    // The detail is the retry's own message (the SDK's error after it), the reason beside it, not repeated in it.
    expect(fieldsOf(fields)).toMatchObject({
      job_id: job.jobId,
      reason: 'llm_client',
      detail: 'model call failed: 400 fake error 400',
    });
    expect(await pending()).toBe(0);
    expect(await count('summaries')).toBe(0);
  });

  it("a handler's dead-letter commands that throw: the entry is dead-lettered without them, not left in the stream", async () => {
    const w = await worker();
    model.reply = () => ({ kind: 'error', status: 400 });
    // Fault injection around the real handler: its hook fails while the MULTI is built.
    w.handler.deadLettered = () => {
      throw new Error('a bug in the hook');
    };
    const job = newJob();
    await queue.enqueue(job);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    const [[, fields]] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(fieldsOf(fields)).toMatchObject({ job_id: job.jobId, reason: 'llm_client' });
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
    // What the hook would have done (the job record marked failed) did not happen; the rest did.
    expect(await redis.hget(jobRecordKey(job.jobId), 'status')).not.toBe('failed');
  });

  it.each([
    [
      'refuses as it queues (EXECABORT: none of the MULTI runs)',
      (tx: ChainableCommander) => tx.call('NO-SUCH-COMMAND'),
    ],
    ['fails as it runs (WRONGTYPE)', (tx: ChainableCommander) => tx.lpush(JOBS_STREAM, 'x')],
  ])("a handler's dead-letter command that Redis %s: the entry is dead-lettered all the same", async (_how, hook) => {
    const w = await worker();
    model.reply = () => ({ kind: 'error', status: 400 });
    w.handler.deadLettered = (tx) => {
      hook(tx);
    };
    const job = newJob();
    await queue.enqueue(job);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    const dead = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(dead).toHaveLength(1);
    expect(fieldsOf(dead[0][1])).toMatchObject({ job_id: job.jobId, reason: 'llm_client' });
    expect(await pending()).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });

  it('a job that keeps getting 429 makes LLM_MAX_ATTEMPTS calls in one delivery and stays pending', async () => {
    const w = await worker({ LLM_MAX_ATTEMPTS: '3' });
    model.reply = () => ({ kind: 'error', status: 429, headers: { 'retry-after-ms': '20' } });
    await queue.enqueue(newJob());
    expect(await w.consumer.runOnce()).toEqual([expect.objectContaining({ deliveries: 1, outcome: 'transient' })]);
    expect(model.calls).toBe(3);
    expect(await pending()).toBe(1);
    expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(0);
  });

  it('a malformed entry is dead-lettered at once, without a model call', async () => {
    const w = await worker();
    const id = await redis.xadd(JOBS_STREAM, '*', 'job_id', 'not-a-uuid', 'payload', '{');
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(model.calls).toBe(0);
    const [[, fields]] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(fieldsOf(fields)).toMatchObject({ job_id: 'not-a-uuid', reason: 'malformed', source_id: id });
  });

  it('a payload without text or notify is dead-lettered malformed as it is read: no run, no step, no model call', async () => {
    const w = await worker();
    const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
    const id = await redis.xadd(JOBS_STREAM, '*', 'job_id', jobId, 'tenant', 'tenant-a', 'payload', '{"text":"x"}');
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(model.calls).toBe(0);
    const [[, fields]] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    // The detail as it was before summaries ran on the engine: the parser's own words, nothing before them.
    expect(fieldsOf(fields)).toMatchObject({
      job_id: jobId,
      reason: 'malformed',
      detail: 'payload needs text and notify',
      source_id: id,
    });
    expect(await count('workflow_runs')).toBe(0);
    expect(await count('workflow_steps')).toBe(0);
    expect(await pending()).toBe(0);
  });

  it('a pending entry deleted from the stream is dead-lettered by id, not dropped', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '200' });
    await queue.enqueue(newJob());
    await createGroup();
    const [entry] = await readAs('gone-consumer');
    await redis.xdel(JOBS_STREAM, entry.id);
    await idlePast(200); // its id, still in the group, is claimable
    expect(await w.consumer.runOnce()).toEqual([]);
    const [[, fields]] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(fieldsOf(fields)).toEqual({ reason: 'deleted_from_stream', source_id: entry.id });
    expect(await pending()).toBe(0);
  });

  it('a deleted pending entry is never lost when it cannot be dead-lettered yet, and the entries claimed with it still run', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '200' });
    const goneId = await queue.enqueue(newJob());
    const keptId = await queue.enqueue(newJob());
    await createGroup();
    await readAs('gone-consumer');
    await redis.xdel(JOBS_STREAM, goneId);
    // The dead-letter key cannot take an entry for now (a key of another type).
    await redis.set(DEAD_LETTER_STREAM, 'not a stream');
    await idlePast(200); // both ids claimable
    await expect(w.consumer.runOnce()).rejects.toThrow(/WRONGTYPE/);
    // Nothing was claimed: the deleted id is still in the group, the other entry not counted again.
    expect(await pendingEntries()).toEqual([
      [goneId, 'gone-consumer', 1],
      [keptId, 'gone-consumer', 1],
    ]);
    expect(model.calls).toBe(0);

    await redis.del(DEAD_LETTER_STREAM);
    // One claim dead-letters the deleted id and runs the other entry of its batch.
    expect(await w.consumer.runOnce()).toEqual([{ id: keptId, deliveries: 2, outcome: 'done' }]);
    expect((await redis.xrange(DEAD_LETTER_STREAM, '-', '+')).map(([, f]) => fieldsOf(f))).toEqual([
      { reason: 'deleted_from_stream', source_id: goneId },
    ]);
    expect(await pending()).toBe(0);
    expect(
      await metricValue(w.app.getHttpServer(), 'worker_dead_letters_total', { reason: 'deleted_from_stream' }),
    ).toBe(1);
  });

  it('never reclaims its own entry while the job runs, even when a refresh came too late', async () => {
    // No refresh within CLAIM_IDLE_MS: what a stalled event loop or a failed REFRESH leaves behind.
    const w = await worker({ CLAIM_IDLE_MS: '200' }, { refreshIntervalMs: 60_000 });
    // The job runs until the test lets it end: still running at the second turn, however slow the machine. (A
    // second call, had the turn run the job again, is answered at once.)
    const answer = Promise.withResolvers<void>();
    model.reply = async (n) => {
      if (n === 1) await answer.promise;
      return { kind: 'complete', content: 'Slow.' };
    };
    const id = await queue.enqueue(newJob());
    const running = w.consumer.runOnce();
    await eventually(() => (model.calls === 1 ? true : undefined), 5000, 'the model call');
    await idlePast(200); // the entry is now idle past CLAIM_IDLE_MS, and claimable
    expect(await w.consumer.runOnce()).toEqual([]);
    expect(w.consumer.inFlightCount).toBe(1);
    answer.resolve();
    expect(await running).toEqual([{ id, deliveries: 1, outcome: 'done' }]);
    expect(model.calls).toBe(1);
    expect(w.consumer.inFlightCount).toBe(0);
    expect(await pending()).toBe(0);
  });

  it('keeps the XAUTOCLAIM cursor between turns: reclaimable entries past the first scan window are reached', async () => {
    // One slot: each XAUTOCLAIM asks for one entry, so it looks at no more than ten pending ones.
    // A minute: the first 25 stay far from it however long the turns take on a slow machine.
    const w = await worker({ CLAIM_IDLE_MS: '60000', WORKER_CONCURRENCY: '1' });
    const ids: string[] = [];
    for (let i = 0; i < 30; i++) ids.push(await queue.enqueue(newJob()));
    await createGroup();
    expect(await readAs('dead-consumer', 30)).toHaveLength(30);
    // Only the last 5 are idle past CLAIM_IDLE_MS; the first 25, just read, fill the first scan windows with nothing
    // to take.
    await idleFor('dead-consumer', ids.slice(25), 61_000);
    const turns: string[][] = [];
    for (let t = 0; t < 8; t++) turns.push((await w.consumer.runOnce()).map((r) => r.id));
    // ids 1-10, then 11-20 scanned; then 21-25 and the 26th claimed; one per turn after that; then the scan is over.
    expect(turns).toEqual([[], [], [ids[25]], [ids[26]], [ids[27]], [ids[28]], [ids[29]], []]);
    expect(await pending()).toBe(25);
  });

  it('on shutdown takes its consumer out of the group, unless entries are still pending for it', async () => {
    const clean = await worker();
    const left = await worker({ LLM_MAX_ATTEMPTS: '1' });
    await queue.enqueue(newJob());
    expect((await clean.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    model.reply = () => ({ kind: 'error', status: 503 });
    await queue.enqueue(newJob());
    expect((await left.consumer.runOnce()).map((r) => r.outcome)).toEqual(['transient']);
    expect(await consumerNames()).toEqual([clean.consumer.consumerName, left.consumer.consumerName].sort());
    for (const w of workers.splice(0)) await w.close();
    expect(await consumerNames()).toEqual([left.consumer.consumerName]);
    expect(await pendingEntries()).toEqual([[expect.any(String), left.consumer.consumerName, 1]]);
  });

  describe('when the ack fails', () => {
    // Its own redis-server: CLIENT PAUSE and ACL changes must not reach other suites.
    let server: RedisServer;
    let admin: Redis;
    let privateQueue: SummaryJobQueue;

    beforeAll(async () => {
      server = await startRedisServer(freePort(30));
    });
    afterAll(() => server.stop());
    beforeEach(async () => {
      admin = new Redis(server.url);
      await admin.flushall();
      privateQueue = new SummaryJobQueue(admin);
    });
    afterEach(async () => {
      await admin.call('CLIENT', 'UNPAUSE');
      await admin.call('ACL', 'SETUSER', 'default', '+@all');
      // Closed here, while the server is back to normal.
      await Promise.all(workers.splice(0).map((w) => w.close()));
      admin.disconnect();
    });

    it('an ack that times out after Redis ran it: the finished job is neither dead-lettered nor marked failed', async () => {
      const w = await worker({ REDIS_URL: server.url });
      // As on any server that has seen an ack: the script is cached, so the held EVALSHA runs when let go.
      await admin.script('LOAD', ACK.lua);
      const job = newJob();
      const id = await privateQueue.enqueue(job);
      model.reply = async () => {
        // Holds every write from now on, the ack included, past the worker's 2 s command timeout.
        await admin.call('CLIENT', 'PAUSE', '15000', 'WRITE');
        return { kind: 'complete', content: 'Done before the ack.' };
      };
      expect(await w.consumer.runOnce()).toEqual([{ id, deliveries: 1, outcome: 'transient' }]);
      expect(await count('summaries')).toBe(1);
      await admin.call('CLIENT', 'UNPAUSE');
      await w.redis.ping(); // answered after everything the worker sent before it
      expect(await admin.xlen(DEAD_LETTER_STREAM)).toBe(0);
      expect((await admin.hgetall(jobRecordKey(job.jobId))).status).toBeUndefined();
      // The ack ran late: nothing is left to redeliver.
      expect(await admin.xlen(JOBS_STREAM)).toBe(0);
      expect(await pendingEntries(admin)).toEqual([]);
      expect(await metricValue(w.app.getHttpServer(), 'worker_jobs_total', { outcome: 'transient' })).toBe(1);
    });

    it('an ack that fails: the finished job stays pending, and its redelivery is acked as a duplicate', async () => {
      const w = await worker({ REDIS_URL: server.url, CLAIM_IDLE_MS: '200' });
      const job = newJob();
      const id = await privateQueue.enqueue(job);
      model.reply = async () => {
        // From now on Redis refuses the worker's scripts, and so its ack; plain commands still work.
        await admin.call('ACL', 'SETUSER', 'default', '-eval', '-evalsha');
        return { kind: 'complete', content: 'Done before the ack.' };
      };
      expect(await w.consumer.runOnce()).toEqual([{ id, deliveries: 1, outcome: 'transient' }]);
      expect(await count('summaries')).toBe(1);
      expect(await admin.xlen(DEAD_LETTER_STREAM)).toBe(0);
      expect((await admin.hgetall(jobRecordKey(job.jobId))).status).toBeUndefined();
      expect(await pendingEntries(admin)).toEqual([[id, w.consumer.consumerName, 1]]);

      await admin.call('ACL', 'SETUSER', 'default', '+@all');
      await idlePast(200, admin); // the finished job's entry is claimable
      expect(await w.consumer.runOnce()).toEqual([{ id, deliveries: 2, outcome: 'duplicate' }]);
      expect(model.calls).toBe(1);
      expect(await count('summaries')).toBe(1);
      expect(await count('outbox')).toBe(1);
      expect(await pendingEntries(admin)).toEqual([]);
      expect(await admin.xlen(JOBS_STREAM)).toBe(0);
      expect(await admin.xlen(DEAD_LETTER_STREAM)).toBe(0);
    });
  });

  it('exposes its counters at 0 before anything happens, so the first dead letter is an increase()', async () => {
    const server = (await worker()).app.getHttpServer();
    const series: [string, Record<string, string>][] = [
      ['worker_jobs_total', { outcome: 'dead_lettered' }],
      ['worker_jobs_total', { outcome: 'transient' }],
      ['worker_dead_letters_total', { reason: 'max_deliveries' }],
      ['worker_dead_letters_total', { reason: 'llm_client' }],
      ['worker_llm_calls_total', { outcome: 'failed', error_class: 'rate_limited' }],
      ['worker_reclaimed_total', {}],
    ];
    for (const [name, labels] of series) {
      expect({ name, labels, value: await metricSample(server, name, labels) }).toEqual({ name, labels, value: 0 });
    }
  });

  it('moves its metrics by exactly what happened: one done, one dead-lettered, one 400 call, queue figures', async () => {
    const w = await worker();
    const server = w.app.getHttpServer();
    const m = (name: string, labels: Record<string, string> = {}) => metricValue(server, name, labels);
    await queue.enqueue(newJob());
    await w.consumer.runOnce();
    model.reply = () => ({ kind: 'error', status: 400 });
    await queue.enqueue(newJob());
    await w.consumer.runOnce();
    expect(await m('worker_jobs_total', { outcome: 'done' })).toBe(1);
    expect(await m('worker_jobs_total', { outcome: 'dead_lettered' })).toBe(1);
    expect(await m('worker_llm_calls_total', { outcome: 'ok', error_class: 'none' })).toBe(1);
    expect(await m('worker_llm_calls_total', { outcome: 'failed', error_class: 'client' })).toBe(1);
    expect(await m('worker_dead_letters_total', { reason: 'llm_client' })).toBe(1);
    expect(await m('worker_llm_attempts_per_job_count')).toBe(2);
    expect(await m('worker_job_duration_seconds_count', { outcome: 'done' })).toBe(1);
    expect(await m('jobs_stream_length')).toBe(0);
    expect(await m('jobs_stream_pending')).toBe(0);
    expect(await m('jobs_dead_letter_length')).toBe(1);
    await queue.enqueue(newJob());
    expect(await m('jobs_stream_length')).toBe(1);
  });

  it('creates its group again when Redis lost it (a restart without persistence)', async () => {
    const w = await worker();
    await queue.enqueue(newJob());
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    await redis.flushdb();
    await queue.enqueue(newJob());
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect(await count('summaries')).toBe(2);
  });

  it('with WORKER_CONCURRENCY=16, 64 jobs run 16 at a time', async () => {
    // The model holds every call until 16 are waiting, then answers them all:
    // the jobs finish only if the worker runs 16 at once, in four waves.
    let held: (() => void)[] = [];
    const waves: number[] = [];
    model.reply = () =>
      new Promise((resolve) => {
        held.push(() => resolve({ kind: 'complete', content: 'Parallel.' }));
        if (held.length < 16) return;
        const wave = held;
        held = [];
        waves.push(wave.length);
        for (const answer of wave) answer();
      });
    const w = await worker({ WORKER_CONCURRENCY: '16' }, { blockMs: 100 });
    const jobs = Array.from({ length: 64 }, () => newJob());
    for (const job of jobs) await queue.enqueue(job);
    w.consumer.start();
    await eventually(async () => ((await count('summaries')) === 64 ? true : undefined), 20_000, '64 summaries');
    expect(waves).toEqual([16, 16, 16, 16]);
    expect(model.calls).toBe(64);
    expect(model.peakConcurrency).toBe(16);
    await eventually(async () => ((await pending()) === 0 ? true : undefined), 5000, 'all acked');
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });
});
