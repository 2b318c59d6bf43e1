import { Injectable, Module } from '@nestjs/common';
import { jobIdFor } from '@app/summary-queue';
import {
  entryFieldMap,
  QueueLayout,
  Step,
  type StepContext,
  stepEntryFields,
  type StreamMessage,
  Workflow,
  WorkflowHandler,
} from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * What a step may do besides model calls, on the engine in the real worker:
 * its own transaction (StepContext.transaction), rows through insert(), outbox
 * rows, and its timeout. A test workflow on the shared `workflows` queue,
 * provided by a module of the test's own, found by the explorer beside triage.
 */
const [P] = new QueueLayout('workflows', 1).partitions;

/** What the test tells the step to do next; the step tells the test where it is. */
const script = {
  failAfterWrite: false,
  /** Awaited by delivery n before it opens its transaction. */
  beforeTx: undefined as ((delivery: number) => Promise<void>) | undefined,
  /** Awaited by delivery n once its transaction holds its write. */
  afterWrite: undefined as ((delivery: number) => Promise<void>) | undefined,
};

@Workflow('ledger', { deadlineS: 60 })
@Injectable()
class LedgerWorkflow {
  @Step()
  async book(ctx: StepContext<{ amount: number }>): Promise<{ booked: number }> {
    await script.beforeTx?.(ctx.delivery);
    const tx = await ctx.transaction();
    await tx.query('INSERT INTO wf_test_ledger (run_id, note) VALUES ($1, $2)', [
      ctx.runId,
      `delivery ${ctx.delivery}`,
    ]);
    await script.afterWrite?.(ctx.delivery);
    if (script.failAfterWrite) throw new Error('a bug after the write');
    ctx.insert('wf_test_entries', { run_id: ctx.runId, amount: ctx.input.amount });
    ctx.outbox({ topic: 'ledger.booked', dedupeKey: `booked:${ctx.runId}`, payload: { run_id: ctx.runId } });
    return { booked: ctx.input.amount };
  }

  @Step({ timeoutS: 0.3 })
  async settle(ctx: StepContext): Promise<{ settled: true }> {
    // Waits for its signal: the step's timeout ends it.
    await new Promise((_, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason as Error)));
    return { settled: true };
  }
}

/** A workflow with an input parser (`parse`): the step gets what it returns; what it refuses is malformed. */
@Workflow('tally', {
  parse: (payload: unknown) => {
    const count = (payload as { count?: unknown } | null)?.count;
    if (typeof count !== 'number') throw new Error('a tally needs a count');
    return { count, doubled: count * 2 };
  },
})
@Injectable()
class TallyWorkflow {
  @Step()
  add(ctx: StepContext<{ count: number; doubled: number }>): { doubled: number } {
    return { doubled: ctx.input.doubled };
  }
}

@Module({ providers: [LedgerWorkflow, TallyWorkflow] })
class LedgerModule {}

describe('a step with its own transaction, rows and timeout', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let w: WorkerHarness;

  const rows = (sql: string, params: unknown[] = []) => db.query(sql, params);
  const start = async (): Promise<{ runId: string; message: StreamMessage }> => {
    const runId = jobIdFor(`tenant-a:POST:/v1/ledger:${randomUUID()}`);
    const flat = stepEntryFields({ runId, tenant: 'tenant-a', payload: '{"amount":42}', workflow: 'ledger' });
    const id = await redis.xadd(P.jobs, '*', ...flat);
    return { runId, message: { id: id!, fields: entryFieldMap(flat) } };
  };
  const deliver = (message: StreamMessage, delivery: number) =>
    w.app.get(WorkflowHandler).process(message, {
      source: { queue: 'workflows', partition: 0 },
      delivery,
      deadline: performance.now() + 10_000,
      stopRetrying: new AbortController().signal,
      signal: new AbortController().signal,
    });

  beforeAll(async () => {
    db = await testDataSource();
    await db.query('CREATE TABLE IF NOT EXISTS wf_test_ledger (run_id uuid NOT NULL, note text NOT NULL)');
    await db.query('CREATE TABLE IF NOT EXISTS wf_test_entries (run_id uuid PRIMARY KEY, amount integer NOT NULL)');
    model = await new FakeOpenAiServer().start();
  });
  afterAll(async () => {
    await model.stop();
    await db.query('DROP TABLE IF EXISTS wf_test_ledger, wf_test_entries');
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    await db.query('TRUNCATE wf_test_ledger, wf_test_entries');
    Object.assign(script, { failAfterWrite: false, beforeTx: undefined, afterWrite: undefined });
    w = await startWorker({ modelUrl: model.baseUrl, imports: [LedgerModule], env: { CLAIM_IDLE_MS: '100' } });
  });
  afterEach(async () => {
    await w.close();
    redis.disconnect();
  });

  it("commits the transaction's write, the inserted row and the outbox row with the step's output", async () => {
    const { runId } = await start();
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect(await rows('SELECT run_id, note FROM wf_test_ledger')).toEqual([{ run_id: runId, note: 'delivery 1' }]);
    expect(await rows('SELECT run_id, amount FROM wf_test_entries')).toEqual([{ run_id: runId, amount: 42 }]);
    expect(await rows('SELECT topic, dedupe_key, payload FROM outbox')).toEqual([
      { topic: 'ledger.booked', dedupe_key: `booked:${runId}`, payload: { run_id: runId } },
    ]);
    expect(await rows(`SELECT step, status, output FROM workflow_steps`)).toEqual([
      { step: 'book', status: 'done', output: { booked: 42 } },
    ]);
    // The next step is on the stream, with what book committed in its state.
    const [[, next]] = await redis.xrange(P.jobs, '-', '+');
    expect(next).toEqual(expect.arrayContaining(['step', 'settle', 'state', JSON.stringify({ book: { booked: 42 } })]));
  });

  it('a step that fails after writing in its transaction leaves nothing: the write is rolled back', async () => {
    script.failAfterWrite = true;
    const { runId } = await start();
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(await rows('SELECT count(*)::int AS n FROM wf_test_ledger')).toEqual([{ n: 0 }]);
    expect(await rows('SELECT count(*)::int AS n FROM outbox')).toEqual([{ n: 0 }]);
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'failed' }]);
    const [[, dead]] = await redis.xrange(P.dead, '-', '+');
    expect(dead).toEqual(expect.arrayContaining(['reason', 'unexpected']));
  });

  it('two deliveries of one step at once: the one that commits second loses, and its write is rolled back', async () => {
    const { message } = await start();
    const arrived = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    const go = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    const firstWrote = Promise.withResolvers<void>();
    const firstCommits = Promise.withResolvers<void>();
    script.beforeTx = async (n) => {
      arrived[n - 1].resolve();
      await go[n - 1].promise;
    };
    script.afterWrite = async (n) => {
      if (n !== 1) return;
      firstWrote.resolve();
      await firstCommits.promise;
    };
    // Timeline: both deliveries begin (the step row running, attempts 2); the first opens its transaction (the
    // step row's lock) and writes; the second asks for the lock; the first commits; the second writes, finds the
    // step done at its commit, and rolls back.
    const a = deliver(message, 1);
    await arrived[0].promise;
    const b = deliver(message, 2);
    await arrived[1].promise;
    go[0].resolve();
    await firstWrote.promise;
    go[1].resolve();
    firstCommits.resolve();
    expect((await Promise.all([a, b])).map((r) => r.outcome)).toEqual(['done', 'duplicate']);
    expect(await rows('SELECT note FROM wf_test_ledger')).toEqual([{ note: 'delivery 1' }]);
    expect(await rows('SELECT count(*)::int AS n FROM wf_test_entries')).toEqual([{ n: 1 }]);
    expect(await rows('SELECT count(*)::int AS n FROM outbox')).toEqual([{ n: 1 }]);
    expect(await rows(`SELECT status, attempts FROM workflow_steps`)).toEqual([{ status: 'done', attempts: 2 }]);
  });

  it("a workflow's input parser: its step gets what it returns; what it refuses is malformed, with no run begun", async () => {
    const tally = async (payload: string) => {
      const runId = jobIdFor(`tenant-a:POST:/v1/tally:${randomUUID()}`);
      await redis.xadd(P.jobs, '*', ...stepEntryFields({ runId, tenant: 'tenant-a', payload, workflow: 'tally' }));
      return runId;
    };
    const good = await tally('{"count":2}');
    const bad = await tally('{"count":"two"}');
    expect((await w.consumer.runOnce()).map((r) => r.outcome).sort()).toEqual(['dead_lettered', 'done']);
    expect(await rows('SELECT run_id, status, output FROM workflow_runs')).toEqual([
      { run_id: good, status: 'done', output: { doubled: 4 } },
    ]);
    expect(await rows('SELECT run_id FROM workflow_steps')).toEqual([{ run_id: good }]);
    const dead = (await redis.xrange(P.dead, '-', '+')).map(([, flat]) => entryFieldMap(flat));
    expect(dead).toEqual([
      expect.objectContaining({ job_id: bad, workflow: 'tally', reason: 'malformed', detail: 'a tally needs a count' }),
    ]);
  });

  it('a step past its timeout is cut off and left pending for a redelivery', async () => {
    await start();
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['transient']);
    expect(await rows(`SELECT step, status, attempts FROM workflow_steps ORDER BY started_at`)).toEqual([
      { step: 'book', status: 'done', attempts: 1 },
      { step: 'settle', status: 'running', attempts: 1 },
    ]);
    expect(Number(((await redis.xpending(P.jobs, 'workflows')) as [number])[0])).toBe(1);
    expect(await redis.xlen(P.dead)).toBe(0);
  });
});
