import { Injectable, Module } from '@nestjs/common';
import { HealthChecksRegistry } from '@app/health';
import { jobIdFor } from '@app/summary-queue';
import {
  HandBackError,
  JobError,
  NonRetryableStepError,
  QueueLayout,
  Step,
  type StepContext,
  stepEntryFields,
  type StreamMessage,
  Workflow,
  WorkflowHandler,
  WorkflowStore,
} from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * The engine's races, each built with seams (a step that waits for the test's
 * signal) on the real worker, Redis and PostgreSQL: two deliveries of one
 * step, a step holding its own transaction, a batch with one bad step, a
 * re-driven run with a deadline, a loaded worker's liveness.
 */

/** What the test tells the steps to do; the steps tell the test where they are. */
const script = {
  /** Awaited by `hop` on delivery n before it returns. */
  hop: undefined as ((delivery: number) => Promise<void>) | undefined,
  /** Awaited by `held` once its transaction is open. */
  held: undefined as (() => Promise<void>) | undefined,
  /** Awaited by `batch` (each run) before it returns. */
  batch: undefined as ((input: BatchInput) => Promise<void>) | undefined,
  /** Awaited by `solo` on delivery n before it returns. */
  solo: undefined as ((delivery: number) => Promise<void>) | undefined,
};

@Workflow('races', { deadlineS: 60 })
@Injectable()
class RacesWorkflow {
  @Step()
  async hop(ctx: StepContext): Promise<{ hopped: number }> {
    await script.hop?.(ctx.delivery);
    return { hopped: ctx.delivery };
  }

  @Step()
  landed(): { landed: true } {
    return { landed: true };
  }
}

@Workflow('held')
@Injectable()
class HeldWorkflow {
  @Step()
  async hold(ctx: StepContext): Promise<{ held: true }> {
    const tx = await ctx.transaction();
    await tx.query('SELECT 1');
    await script.held?.();
    return { held: true };
  }
}

interface BatchInput {
  readonly bad?: 'bigint' | 'no_table';
}

@Workflow('batch')
@Injectable()
class BatchWorkflow {
  @Step()
  async only(ctx: StepContext<BatchInput>): Promise<unknown> {
    await script.batch?.(ctx.input);
    if (ctx.input.bad === 'no_table') ctx.insert('wf_race_no_such_table', { run_id: ctx.runId });
    else ctx.insert('wf_race_rows', { run_id: ctx.runId, user: 'u' });
    return ctx.input.bad === 'bigint' ? { n: 1n } : { ok: true };
  }
}

/** One step, no deadline: its first delivery runs unbegun (runsUnbegun), its commit writing every row. */
@Workflow('lone')
@Injectable()
class LoneWorkflow {
  @Step()
  async solo(ctx: StepContext): Promise<{ solo: number }> {
    await script.solo?.(ctx.delivery);
    ctx.insert('wf_race_rows', { run_id: ctx.runId, user: `delivery ${ctx.delivery}` });
    return { solo: ctx.delivery };
  }
}

@Module({ providers: [RacesWorkflow, HeldWorkflow, BatchWorkflow, LoneWorkflow] })
class RacesModule {}

describe('the engine under races', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  const workers: WorkerHarness[] = [];
  const worker = async (
    env: Record<string, string> = {},
    consumer: Parameters<typeof startWorker>[0]['consumer'] = {},
  ) => {
    const w = await startWorker({ modelUrl: model.baseUrl, imports: [RacesModule], env, consumer });
    workers.push(w);
    return w;
  };
  const rows = (sql: string, params: unknown[] = []) => db.query(sql, params);
  const entry = async (workflow: string, input: unknown, partitions = 1, partition = 0) => {
    const runId = jobIdFor(`tenant-a:POST:/v1/${workflow}:${randomUUID()}`);
    const flat = stepEntryFields({ runId, tenant: 'tenant-a', payload: JSON.stringify(input), workflow });
    const id = await redis.xadd(new QueueLayout('workflows', partitions).partitions[partition].jobs, '*', ...flat);
    const fields: Record<string, string> = {};
    for (let i = 0; i < flat.length; i += 2) fields[flat[i]] = flat[i + 1];
    return { runId, message: { id: id!, fields } as StreamMessage };
  };
  const [P] = new QueueLayout('workflows', 1).partitions;
  const stepsOnStream = async (step: string) =>
    (await redis.xrange(P.jobs, '-', '+')).filter(([, f]) => f.includes('step') && f[f.indexOf('step') + 1] === step);
  /** Resolves once a session of the test database waits on a lock (`what` names it for a timeout). */
  const waitingOnALock = (what: string) =>
    eventually(
      async () => {
        const [{ n }] = await rows(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`,
        );
        return n > 0 ? true : undefined;
      },
      5000,
      what,
    );
  const deliver = (w: WorkerHarness, message: StreamMessage, delivery: number) =>
    w.app.get(WorkflowHandler).process(message, {
      source: { queue: 'workflows', partition: 0 },
      delivery,
      deadline: performance.now() + 10_000,
      stopRetrying: new AbortController().signal,
      signal: new AbortController().signal,
    });

  beforeAll(async () => {
    db = await testDataSource();
    await db.query('CREATE TABLE IF NOT EXISTS wf_race_rows (run_id uuid PRIMARY KEY, "user" text NOT NULL)');
    model = await new FakeOpenAiServer().start();
  });
  afterAll(async () => {
    await model.stop();
    await db.query('DROP TABLE IF EXISTS wf_race_rows');
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    await db.query('TRUNCATE wf_race_rows');
    Object.assign(script, { hop: undefined, held: undefined, batch: undefined, solo: undefined });
  });
  afterEach(async () => {
    for (const w of workers.splice(0)) await w.close();
    redis.disconnect();
  });

  /*
   * Timeline: worker A reads hop's entry (delivery 1) and waits in the step; the entry is taken from A (as a
   * reclaim takes an entry whose worker stalled) and worker B reclaims it, runs hop, commits and acks, adding
   * landed's entry; A's step returns, loses the commit, and acks too. Only the ack that acknowledged the entry adds
   * the next step: one `landed` entry, not two.
   */
  it('two deliveries of one step, the second a reclaim while the first runs: one next-step entry', async () => {
    const a = await worker();
    const b = await worker();
    const firstRuns = Promise.withResolvers<void>();
    const releaseFirst = Promise.withResolvers<void>();
    script.hop = async (n) => {
      if (n !== 1) return;
      firstRuns.resolve();
      await releaseFirst.promise;
    };
    const { runId, message } = await entry('races', {});
    const first = a.consumer.runOnce();
    await firstRuns.promise;
    // Taken from A, idle long enough for any reclaim: B's next turn claims it.
    await redis.xclaim(P.jobs, 'workflows', 'stalled', 0, message.id, 'IDLE', 3_600_000);
    expect((await b.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    releaseFirst.resolve();
    expect((await first).map((r) => r.outcome)).toEqual(['duplicate']);
    const landed = await stepsOnStream('landed');
    expect(landed).toHaveLength(1);
    expect(await redis.xlen(P.jobs)).toBe(1);
    expect(await rows('SELECT step, status FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
      { step: 'hop', status: 'done' },
    ]);
  });

  /*
   * Timeline: hop's row is running; another delivery's commit has turned it done but not yet committed (the test's
   * transaction holds the row); this delivery begins and waits for the row; the commit lands. Begin reports the
   * row as it is now (done, with the committed output), not as its statement first saw it: hop is not run again.
   */
  it('begin that waited on a commit reports the step done, with its output, and does not run it', async () => {
    const w = await worker();
    const { runId, message } = await entry('races', {});
    await rows(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps)
                VALUES ($1, 'races', 'tenant-a', 'running', '{hop,landed}')`,
      [runId],
    );
    await rows(`INSERT INTO workflow_steps (run_id, step, status, attempts) VALUES ($1, 'hop', 'running', 1)`, [runId]);
    let ran = 0;
    script.hop = async () => void ran++;
    const commit = db.createQueryRunner();
    await commit.connect();
    await commit.startTransaction();
    try {
      await commit.query(`UPDATE workflow_steps SET status = 'done', output = '{"hopped": 7}' WHERE run_id = $1`, [
        runId,
      ]);
      const delivered = deliver(w, message, 2);
      await waitingOnALock('begin waiting for the step row');
      await commit.commitTransaction();
      const result = await delivered;
      expect(result.outcome).toBe('duplicate');
      expect(result.next?.fields).toEqual(expect.arrayContaining(['state', JSON.stringify({ hop: { hopped: 7 } })]));
      expect(ran).toBe(0);
      expect(await rows('SELECT status, attempts FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
        { status: 'done', attempts: 1 },
      ]);
    } finally {
      if (commit.isTransactionActive) await commit.rollbackTransaction();
      await commit.release();
    }
  });

  it('a committed step is not failed by a late FAIL, nor is its run', async () => {
    const w = await worker();
    const { runId } = await entry('races', {});
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    await w.app.get(WorkflowStore).fail({
      runId,
      workflow: 'races',
      tenant: 'tenant-a',
      steps: ['hop', 'landed'],
      step: 'hop',
      error: 'max_deliveries',
    });
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'running' }]);
    expect(await rows('SELECT status FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([{ status: 'done' }]);
  });

  /*
   * Timeline: deliveries 1 and 2 of hop both begin (running); delivery 1 fails the step for good (the step's
   * own verdict) and is dead-lettered; delivery 2 returns, loses the commit to a failed row, and leaves: acked
   * with no next step and no second dead letter.
   */
  it('a delivery that loses to a failed step leaves without a dead letter of its own', async () => {
    const w = await worker();
    const { runId, message } = await entry('races', {});
    const bothRun = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    const go = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    script.hop = async (n) => {
      bothRun[n - 1].resolve();
      await go[n - 1].promise;
      if (n === 1) throw new NonRetryableStepError('no', 'ticket_closed');
    };
    const first = deliver(w, message, 1);
    await bothRun[0].promise;
    const second = deliver(w, message, 2);
    await bothRun[1].promise;
    go[0].resolve();
    await expect(first).rejects.toMatchObject({ failure: { kind: 'ticket_closed', retryable: false } });
    go[1].resolve();
    expect(await second).toEqual({ outcome: 'duplicate' });
    expect(await rows('SELECT status, error FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
      { status: 'failed', error: 'ticket_closed: no' },
    ]);
  });

  /*
   * Timeline: delivery 1 of hold opens its transaction (the run's and the step's row locks) and waits; delivery 2
   * begins meanwhile, together with another run's first step: it is answered at once as running elsewhere (left
   * pending, nothing changed), and the other run's step is not held up behind the lock.
   */
  it("a duplicate delivery of a step in its own transaction is retried later, and blocks no one's begin", async () => {
    const w = await worker();
    const { runId, message } = await entry('held', {});
    const holding = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    script.held = async () => {
      holding.resolve();
      await release.promise;
    };
    const first = deliver(w, message, 1);
    await holding.promise;
    const other = await entry('races', {});
    const [second, bystander] = await Promise.allSettled([deliver(w, message, 2), deliver(w, other.message, 1)]);
    expect(second.status).toBe('rejected');
    const err = (second as PromiseRejectedResult).reason as JobError;
    expect(err).toBeInstanceOf(JobError);
    expect(err.failure).toEqual({ kind: 'running_elsewhere', retryable: true });
    expect(bystander).toMatchObject({ status: 'fulfilled', value: { outcome: 'done' } });
    expect(await rows('SELECT status, attempts FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
      { status: 'running', attempts: 1 },
    ]);
    release.resolve();
    expect(await first).toEqual({ outcome: 'done' });
  });

  /*
   * Three steps finish at once (released by one signal): their commits go in one batch. One's output cannot be
   * serialized, one inserts into a table that does not exist: each fails alone, for its own reason, and the good
   * one commits.
   */
  it('one bad step does not fail the batch it commits with', async () => {
    const w = await worker();
    const released = Promise.withResolvers<void>();
    let waiting = 0;
    const allWaiting = Promise.withResolvers<void>();
    script.batch = async () => {
      if (++waiting === 3) allWaiting.resolve();
      await released.promise;
    };
    const good = await entry('batch', {});
    const bigint = await entry('batch', { bad: 'bigint' });
    const noTable = await entry('batch', { bad: 'no_table' });
    const ran = w.consumer.runOnce();
    await allWaiting.promise;
    released.resolve();
    const outcomes = new Map((await ran).map((r) => [r.id, r.outcome]));
    expect(outcomes).toEqual(
      new Map([
        [good.message.id, 'done'],
        [bigint.message.id, 'dead_lettered'],
        [noTable.message.id, 'transient'],
      ]),
    );
    expect(await rows('SELECT run_id, "user" FROM wf_race_rows')).toEqual([{ run_id: good.runId, user: 'u' }]);
    const reasons = (await redis.xrange(P.dead, '-', '+')).map(([, f]) => [
      f[f.indexOf('job_id') + 1],
      f[f.indexOf('reason') + 1],
    ]);
    // A table not there (yet) is the rollout's order, not the step's fault: left pending, retried.
    expect(new Map(reasons as [string, string][])).toEqual(new Map([[bigint.runId, 'output_not_serializable']]));
    const pending = (await redis.xpending(P.jobs, 'workflows', '-', '+', 10)) as [string][];
    expect(pending.map(([id]) => id)).toEqual([noTable.message.id]);
  });

  /*
   * Timeline: the step's table is not migrated yet (the worker rolled out first): its commit fails with 42P01 and
   * the entry is left pending, not dead-lettered; the migration lands; the redelivery commits the step and its row.
   */
  it('a step whose table is not migrated yet is retried, and commits once the table exists', async () => {
    const w = await worker();
    const { runId, message } = await entry('batch', { bad: 'no_table' });
    await expect(deliver(w, message, 1)).rejects.toMatchObject({ failure: { kind: 'database', retryable: true } });
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'running' }]);
    await rows('CREATE TABLE wf_race_no_such_table (run_id uuid PRIMARY KEY)');
    try {
      expect(await deliver(w, message, 2)).toEqual({ outcome: 'done' });
      expect(await rows('SELECT run_id FROM wf_race_no_such_table')).toEqual([{ run_id: runId }]);
    } finally {
      await rows('DROP TABLE wf_race_no_such_table');
    }
  });

  it('a re-driven run with a deadline counts it from the re-drive, not from its first delivery', async () => {
    const w = await worker();
    const { runId, message } = await entry('races', {});
    // The run failed two hours ago, far past its 60 s deadline; the re-drive puts its entry back.
    await rows(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, created_at, deadline_from, finished_at)
       VALUES ($1, 'races', 'tenant-a', 'failed', '{hop,landed}', 'llm_client', now() - interval '2 hours',
               now() - interval '2 hours', now() - interval '2 hours')`,
      [runId],
    );
    await rows(
      `INSERT INTO workflow_steps (run_id, step, status, attempts, error) VALUES ($1, 'hop', 'failed', 1, 'llm_client')`,
      [runId],
    );
    const redriven = { ...message, fields: { ...message.fields, redriven: '1' } };
    expect(await deliver(w, redriven, 1)).toMatchObject({ outcome: 'done' });
    expect(await rows('SELECT status, attempts FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
      { status: 'done', attempts: 2 },
    ]);
  });

  /*
   * Timeline: hop's delivery 1 failed the run and was dead-lettered; a late delivery of the same entry (a reclaim
   * that was already under way) begins: it finds the run failed and is no re-drive, so it is acked without running
   * hop, schedules nothing and leaves the run failed, as Redis has it. Only a re-driven entry sets it running again.
   */
  it('a late delivery meeting a failed run acks without running it; only a re-drive revives the run', async () => {
    const w = await worker();
    const { runId, message } = await entry('races', {});
    await rows(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, finished_at)
       VALUES ($1, 'races', 'tenant-a', 'failed', '{hop,landed}', 'ticket_closed', now())`,
      [runId],
    );
    await rows(
      `INSERT INTO workflow_steps (run_id, step, status, attempts, error) VALUES ($1, 'hop', 'failed', 1, 'x')`,
      [runId],
    );
    let ran = 0;
    script.hop = async () => void ran++;
    expect(await deliver(w, message, 2)).toEqual({ outcome: 'duplicate' });
    expect(ran).toBe(0);
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'failed' }]);
    expect(await rows('SELECT status, attempts FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
      { status: 'failed', attempts: 1 },
    ]);
    const redriven = { ...message, fields: { ...message.fields, redriven: '1' } };
    expect(await deliver(w, redriven, 1)).toMatchObject({ outcome: 'done' });
    expect(ran).toBe(1);
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'running' }]);
  });

  /*
   * Timeline: delivery 1 of hold opens its transaction (the run's row) and waits; the entry is taken from its
   * worker (JUSTID: no delivery counted) and worker B reclaims it as delivery 2, which finds the run busy. B hands
   * it back with its count set back to 1: waiting on a slow holder never counts toward MAX_DELIVERIES.
   */
  it('a delivery that finds its run busy elsewhere is handed back uncounted', async () => {
    const a = await worker();
    const b = await worker();
    const holding = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    script.held = async () => {
      holding.resolve();
      await release.promise;
    };
    const { message } = await entry('held', {});
    const first = a.consumer.runOnce();
    await holding.promise;
    await redis.xclaim(P.jobs, 'workflows', 'stalled', 0, message.id, 'IDLE', 3_600_000, 'JUSTID');
    expect((await b.consumer.runOnce()).map((r) => [r.deliveries, r.outcome])).toEqual([[2, 'transient']]);
    const pending = (await redis.xpending(P.jobs, 'workflows', '-', '+', 10)) as [string, string, number, number][];
    expect(pending.map(([id, , , n]) => [id, Number(n)])).toEqual([[message.id, 1]]);
    release.resolve();
    expect((await first).map((r) => r.outcome)).toEqual(['done']);
  });

  /*
   * Timeline: worker A runs hop (delivery 1) and waits in the step; meanwhile its entry leaves the stream without
   * A (as a dead letter or another delivery's ack does: XACK + XDEL). A's step returns and wins the commit: its
   * XACK takes nothing, yet the run goes on. The gate on the run's record adds landed once; a second ack of the
   * same step (a redelivery that finds hop done) adds nothing.
   */
  it('a won commit whose entry was acked elsewhere still schedules the next step, once', async () => {
    const a = await worker();
    const inStep = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    script.hop = async () => {
      inStep.resolve();
      await release.promise;
    };
    const { runId, message } = await entry('races', {});
    const first = a.consumer.runOnce();
    await inStep.promise;
    await redis.xack(P.jobs, 'workflows', message.id);
    await redis.xdel(P.jobs, message.id);
    release.resolve();
    expect((await first).map((r) => r.outcome)).toEqual(['done']);
    expect(await stepsOnStream('landed')).toHaveLength(1);
    expect(await rows('SELECT status FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([{ status: 'done' }]);
    expect((await a.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']); // landed: the run is done
    // A late duplicate of hop's entry (re-added, as a second start would) finds hop done and is acked: the gate does
    // not let its ack add landed a second time.
    await redis.xadd(P.jobs, '*', ...Object.entries(message.fields).flat());
    expect((await a.consumer.runOnce()).map((r) => r.outcome)).toEqual(['duplicate']);
    expect(await redis.xlen(P.jobs)).toBe(0);
  });

  /*
   * Timeline: a commit of hop holds the run's row (as commit's `locked` CTE does), then marks the step done; a FAIL
   * of the same step comes in between. FAIL waits for the run's row before it touches the step's (no deadlock: the
   * order begin and commit take), then sees the committed step: neither the step nor the run is failed.
   */
  it('a FAIL racing a commit waits for the run row, and fails neither a committed step nor its run', async () => {
    const w = await worker();
    const { runId } = await entry('races', {});
    await rows(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps)
                VALUES ($1, 'races', 'tenant-a', 'running', '{hop,landed}')`,
      [runId],
    );
    await rows(`INSERT INTO workflow_steps (run_id, step, status, attempts) VALUES ($1, 'hop', 'running', 1)`, [runId]);
    const commit = db.createQueryRunner();
    await commit.connect();
    await commit.startTransaction();
    try {
      await commit.query('SELECT 1 FROM workflow_runs WHERE run_id = $1 FOR NO KEY UPDATE', [runId]);
      const failing = w.app.get(WorkflowStore).fail({
        runId,
        workflow: 'races',
        tenant: 'tenant-a',
        steps: ['hop', 'landed'],
        step: 'hop',
        error: 'max_deliveries',
      });
      await waitingOnALock('FAIL waiting for a lock');
      await commit.query(`UPDATE workflow_steps SET status = 'done', output = '{}' WHERE run_id = $1`, [runId]);
      await commit.commitTransaction();
      await failing;
    } finally {
      if (commit.isTransactionActive) await commit.rollbackTransaction();
      await commit.release();
    }
    expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'running' }]);
    expect(await rows('SELECT status FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([{ status: 'done' }]);
  });

  /*
   * One slot, two partitions: partition 0's entry holds the slot (its step waits); partition 1's loop reads an
   * entry and waits for the slot, far longer than a loop may stay silent. Both loops beat while they wait: the
   * worker is loaded, not stuck.
   */
  it('a loaded worker stays live: loops waiting for a slot beat; an entry that never got one is handed back uncounted', async () => {
    // The loops beat every 50 ms (partition 0's reads) and every 150 ms (partition 1's wait for the slot, a quarter
    // of the silence): only a stall of some 450 ms just before the probe could make one look silent.
    const silenceMs = 600;
    const w = await worker(
      { JOB_STREAM_PARTITIONS: '2', WORKER_CONCURRENCY: '1' },
      { blockMs: 50, loopSilenceMs: silenceMs },
    );
    const running = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    script.hop = async () => {
      running.resolve();
      await release.promise;
    };
    // Every partition's loop idle first (its read came back empty; it blocks on its own connection): a read then
    // takes an entry whether or not a slot is free, and waits for one.
    w.consumer.start();
    const blocking = (i: number) => `name=${w.consumer.consumerName}:workflows:blocking:${i} `;
    await eventually(async () => {
      const clients = (await redis.client('LIST')) as string;
      return [0, 1].every((i) => clients.includes(blocking(i))) ? true : undefined;
    });
    await entry('races', {}, 2, 0);
    await running.promise;
    await entry('races', {}, 2, 1);
    const [, P1] = new QueueLayout('workflows', 2).partitions;
    // Partition 1's loop has read its entry (pending for this worker), and waits for the slot.
    await eventually(async () => {
      const [count] = (await redis.xpending(P1.jobs, 'workflows')) as [number];
      return Number(count) === 1 ? true : undefined;
    });
    // The wait itself is what is tested: twice the silence a loop may keep. A loop registered now that never beats
    // marks the moment on liveness's own clock: once it is stale, the waiting loops have waited that long.
    const registry = w.app.get(HealthChecksRegistry);
    registry.registerLoop('never-beats', silenceMs * 2);
    await eventually(
      () => (registry.staleLoops().some((l) => l.name === 'never-beats') ? true : undefined),
      10_000,
      'twice the silence',
    );
    registry.unregisterLoop('never-beats');
    const live = await request(w.app.getHttpServer()).get('/health/live');
    // Shutdown before partition 1's entry got a slot: it is handed back as if never delivered (its count as before
    // the read), for the next reclaim to take at once.
    const stopped = w.consumer.stop();
    release.resolve();
    await stopped;
    expect({ status: live.status, body: live.body as unknown }).toMatchObject({ status: 200 });
    const waiting = (await redis.xpending(P1.jobs, 'workflows', '-', '+', 10)) as [string, string, number, number][];
    expect(waiting.map(([, , , deliveries]) => Number(deliveries))).toEqual([0]);
  });
  it("a step's slot takes the next entry while its commit waits: a slow commit does not hold a slot", async () => {
    const w = await worker({ WORKER_CONCURRENCY: '1' }, { blockMs: 50 });
    // Every commit of `lone` writes wf_race_rows: a lock that lets reads through and no write holds them all.
    const locker = db.createQueryRunner();
    await locker.connect();
    await locker.startTransaction();
    let steps = 0;
    try {
      await locker.query('LOCK TABLE wf_race_rows IN EXCLUSIVE MODE');
      const second = Promise.withResolvers<void>();
      script.solo = () => {
        if (++steps === 2) second.resolve();
        return Promise.resolve();
      };
      const a = await entry('lone', {});
      const b = await entry('lone', {});
      w.consumer.start();
      // One slot: the second run's step runs only if the first one's gave its slot up while its commit waits.
      await second.promise;
      await waitingOnALock("a commit waiting on the test's lock");
      expect(await rows('SELECT run_id FROM workflow_steps WHERE run_id = ANY($1)', [[a.runId, b.runId]])).toEqual([]);
      await locker.commitTransaction();
    } finally {
      if (locker.isTransactionActive) await locker.rollbackTransaction();
      await locker.release();
    }
    await eventually(async () => {
      const done = await rows(`SELECT count(*)::int AS n FROM workflow_steps WHERE status = 'done'`);
      return done[0].n === 2 ? true : undefined;
    });
    expect(await rows('SELECT count(*)::int AS n FROM wf_race_rows')).toEqual([{ n: 2 }]);
    expect(steps).toBe(2);
  });

  it("a drain waits for a commit whose step gave its slot up: the step's row is done once stop() resolves", async () => {
    const w = await worker({ WORKER_CONCURRENCY: '1' }, { blockMs: 50 });
    const locker = db.createQueryRunner();
    await locker.connect();
    await locker.startTransaction();
    let stopped: Promise<void> | undefined;
    const { runId } = await entry('lone', {});
    try {
      await locker.query('LOCK TABLE wf_race_rows IN EXCLUSIVE MODE');
      w.consumer.start();
      await waitingOnALock("the step's commit waiting on the test's lock");
      stopped = w.consumer.stop();
      // Its slot was given up, but the delivery is still in flight: what the drain waits for.
      expect(w.consumer.inFlightCount).toBe(1);
      await locker.commitTransaction();
    } finally {
      if (locker.isTransactionActive) await locker.rollbackTransaction();
      await locker.release();
    }
    await stopped;
    expect(await rows('SELECT status FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([{ status: 'done' }]);
    const [pending] = (await redis.xpending(P.jobs, 'workflows')) as [number];
    expect(Number(pending)).toBe(0);
  });

  describe('a first step run unbegun (its first delivery writes nothing before its commit)', () => {
    /** Holds `solo` on the deliveries given, until released; `reached(n)` resolves once delivery n is in the step. */
    const hold = (...deliveries: number[]) => {
      const at = new Map(deliveries.map((n) => [n, Promise.withResolvers<void>()]));
      const go = new Map(deliveries.map((n) => [n, Promise.withResolvers<void>()]));
      script.solo = async (n) => {
        at.get(n)?.resolve();
        await go.get(n)?.promise;
      };
      return { reached: (n: number) => at.get(n)!.promise, release: (n: number) => go.get(n)!.resolve() };
    };
    /** As the consumer delivers a batch it read: prepared first (which runs have rows), then delivered. */
    const deliverFirst = (w: WorkerHarness, message: StreamMessage) => {
      w.app.get(WorkflowHandler).prepare([message], { queue: 'workflows', partition: 0 });
      return deliver(w, message, 1);
    };
    const stepRows = (runId: string) =>
      rows('SELECT status, attempts, output FROM workflow_steps WHERE run_id = $1', [runId]);
    const effects = (runId: string) => rows('SELECT "user" FROM wf_race_rows WHERE run_id = $1', [runId]);

    it("writes no row while the step runs; its commit creates the run's row (done) and the step's", async () => {
      const w = await worker();
      const h = hold(1);
      const { runId, message } = await entry('lone', {});
      const delivered = deliverFirst(w, message);
      await h.reached(1);
      expect(await rows('SELECT 1 FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([]);
      expect(await stepRows(runId)).toEqual([]);
      h.release(1);
      expect(await delivered).toEqual({ outcome: 'done' });
      expect(
        await rows('SELECT workflow, tenant, status, steps FROM workflow_runs WHERE run_id = $1', [runId]),
      ).toEqual([{ workflow: 'lone', tenant: 'tenant-a', status: 'done', steps: ['solo'] }]);
      expect(await stepRows(runId)).toEqual([{ status: 'done', attempts: 1, output: { solo: 1 } }]);
      expect(await effects(runId)).toEqual([{ user: 'delivery 1' }]);
    });

    /*
     * Timeline: delivery 1 runs unbegun and waits in the step; delivery 2 (a reclaim) begins (rows made, attempts
     * 2), runs and commits; delivery 1's commit finds the run's row and the step done: it loses and goes on with
     * the recorded output. One commit, one effect.
     */
    it('a redelivery that begins and commits first: the unbegun delivery loses to it', async () => {
      const w = await worker();
      const h = hold(1);
      const { runId, message } = await entry('lone', {});
      const first = deliverFirst(w, message);
      await h.reached(1);
      expect(await deliver(w, message, 2)).toEqual({ outcome: 'done' });
      h.release(1);
      expect(await first).toEqual({ outcome: 'duplicate' });
      expect(await stepRows(runId)).toEqual([{ status: 'done', attempts: 2, output: { solo: 2 } }]);
      expect(await effects(runId)).toEqual([{ user: 'delivery 2' }]);
      expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'done' }]);
    });

    /*
     * Timeline: delivery 1 runs unbegun and waits; delivery 2 begins (step row running) and waits too; delivery 1
     * commits: the run's row exists, so the step's row guards, and delivery 1 wins it; delivery 2 then loses.
     */
    it('a redelivery that began but has not committed: the unbegun delivery commits through the step row', async () => {
      const w = await worker();
      const h = hold(1, 2);
      const { runId, message } = await entry('lone', {});
      const first = deliverFirst(w, message);
      await h.reached(1);
      const second = deliver(w, message, 2);
      await h.reached(2);
      expect(await stepRows(runId)).toEqual([{ status: 'running', attempts: 2, output: null }]);
      h.release(1);
      expect(await first).toEqual({ outcome: 'done' });
      h.release(2);
      expect(await second).toEqual({ outcome: 'duplicate' });
      expect(await stepRows(runId)).toEqual([{ status: 'done', attempts: 2, output: { solo: 1 } }]);
      expect(await effects(runId)).toEqual([{ user: 'delivery 1' }]);
    });

    /*
     * Timeline: delivery 1 runs unbegun; another transaction (a begin under way) inserts the run's row and the
     * step's, not committed; delivery 1's commit waits on that insert, then finds the row, and the step running
     * under another delivery: it commits nothing and is retried, counted: its next delivery begins first.
     */
    it('a begin under way when it commits: nothing written, retried (counted)', async () => {
      const w = await worker();
      const h = hold(1);
      const { runId, message } = await entry('lone', {});
      const first = deliverFirst(w, message);
      await h.reached(1);
      const other = db.createQueryRunner();
      await other.connect();
      await other.startTransaction();
      try {
        await other.query(
          `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps) VALUES ($1, 'lone', 'tenant-a', 'running', '{solo}')`,
          [runId],
        );
        await other.query(
          `INSERT INTO workflow_steps (run_id, step, status, attempts) VALUES ($1, 'solo', 'running', 2)`,
          [runId],
        );
        h.release(1);
        await waitingOnALock('the commit waiting on the run row');
        await other.commitTransaction();
      } finally {
        await other.release();
      }
      // A counted retry, not a hand-back: its next delivery is no first one, and begins.
      await expect(first).rejects.toMatchObject({ failure: { kind: 'running_elsewhere', retryable: true } });
      await expect(first).rejects.not.toBeInstanceOf(HandBackError);
      expect(await stepRows(runId)).toEqual([{ status: 'running', attempts: 2, output: null }]);
      expect(await effects(runId)).toEqual([]);
      expect(await rows('SELECT count(*)::int AS n FROM outbox')).toEqual([{ n: 0 }]);
    });

    /*
     * Timeline: a run's start is retried (a crash before its idempotency record was final) and adds a second entry
     * of the run's first step; the first entry's step commits; the second is read: its batch's read finds the run's
     * row, so it begins (not unbegun), finds the step done and goes on without running it.
     */
    it("a second start's entry of a run already done: begun, not run again", async () => {
      const w = await worker();
      let runs = 0;
      script.solo = async () => void runs++;
      const { runId, message } = await entry('lone', {});
      expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
      const again = await redis.xadd(P.jobs, '*', ...Object.entries(message.fields).flat());
      expect(await w.consumer.runOnce()).toEqual([{ id: again, deliveries: 1, outcome: 'duplicate' }]);
      expect(runs).toBe(1);
      expect(await effects(runId)).toEqual([{ user: 'delivery 1' }]);
      expect(await stepRows(runId)).toEqual([{ status: 'done', attempts: 1, output: { solo: 1 } }]);
    });

    it('a first step that fails for good: the run and its step are written failed, the attempt counted', async () => {
      const w = await worker();
      script.solo = () => Promise.reject(new NonRetryableStepError('no such ticket', 'ticket_missing'));
      const { runId, message } = await entry('lone', {});
      await expect(deliverFirst(w, message)).rejects.toMatchObject({ failure: { kind: 'ticket_missing' } });
      expect(await rows('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([{ status: 'failed' }]);
      expect(await rows('SELECT status, attempts FROM workflow_steps WHERE run_id = $1', [runId])).toEqual([
        { status: 'failed', attempts: 1 },
      ]);
    });
  });
});
