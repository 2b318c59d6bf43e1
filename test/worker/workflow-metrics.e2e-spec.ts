import { Injectable, Module } from '@nestjs/common';
import { jobIdFor } from '@app/summary-queue';
import { QueueLayout, Step, stepEntryFields, Workflow, WorkflowRegistry, type WorkflowQueue } from '@app/workflows';
import type { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { DataSource } from 'typeorm';
import { QueueGauges } from '../../apps/worker/src/consumer/queue.gauges';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { metricSample } from '../support/metrics';
import { drain, startTriageRun, TRIAGE_TEXT, WORKFLOWS, WORKFLOWS_GROUP, workerPool } from '../support/triage-runs';

/*
 * The workflow metrics (libs/workflows/src/workflow.metrics.ts) and the queue
 * gauges of every consumed queue (apps/worker/src/consumer/queue.gauges.ts),
 * read from the real worker module's /metrics while the triage workflow runs
 * on Redis Streams and PostgreSQL, the fake model behind the real openai SDK.
 * Runs are started as the api's client starts them (the run's record and its
 * first entry on `{workflows}:jobs`), as in triage-workflow.e2e-spec.ts.
 * Every figure is read with metricSample, which fails on a series that is
 * absent: a 0 asserted is a series at 0.
 */
const [P] = WORKFLOWS.partitions;
const GROUP = WORKFLOWS_GROUP;
const STEPS = ['classify', 'draft', 'notify'] as const;
const TEXT = TRIAGE_TEXT;

/** A workflow on a queue of its own (`{ledger}:jobs`), beside the worker's. */
@Workflow('ledger', { queue: 'ledger' })
@Injectable()
class LedgerWorkflow {
  @Step()
  record(): void {}
}
@Module({ providers: [LedgerWorkflow] })
class LedgerModule {}

describe('workflow metrics and queue gauges', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  const workers = workerPool(() => model.baseUrl);
  const worker = (env: Record<string, string> = {}) => workers.start(env);
  const start = async (): Promise<string> => (await startTriageRun(redis)).runId;
  const answering = (_n: number, text: string): ModelReply =>
    text.startsWith('Category:')
      ? { kind: 'complete', content: 'Dear customer, we are refunding the second charge.' }
      : { kind: 'complete', content: 'billing' };
  const started = (s: Server) => metricSample(s, 'workflow_runs_started_total', { workflow: 'triage' });
  const finished = (s: Server, status: 'done' | 'failed') =>
    metricSample(s, 'workflow_runs_finished_total', { workflow: 'triage', status });
  const durations = (s: Server, step: string, outcome: string) =>
    metricSample(s, 'workflow_step_duration_seconds_count', { workflow: 'triage', step, outcome });
  const attempts = async (s: Server, step: string) => ({
    count: await metricSample(s, 'workflow_step_attempts_count', { workflow: 'triage', step }),
    sum: await metricSample(s, 'workflow_step_attempts_sum', { workflow: 'triage', step }),
  });

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
    await truncateAll(db);
    model.requests.length = 0;
    model.reply = answering;
  });
  afterEach(async () => {
    await workers.closeAll();
    redis.disconnect();
  });

  it('every workflow and step has its series at 0 from the start', async () => {
    const s = (await worker()).app.getHttpServer();
    for (const workflow of ['triage', 'summaries']) {
      expect(await metricSample(s, 'workflow_runs_started_total', { workflow })).toBe(0);
      expect(await metricSample(s, 'workflow_runs_finished_total', { workflow, status: 'done' })).toBe(0);
      expect(await metricSample(s, 'workflow_runs_finished_total', { workflow, status: 'failed' })).toBe(0);
    }
    for (const step of STEPS) {
      for (const outcome of ['done', 'duplicate', 'transient', 'failed'])
        expect(await durations(s, step, outcome)).toBe(0);
      expect(await attempts(s, step)).toEqual({ count: 0, sum: 0 });
    }
    expect(await metricSample(s, 'workflow_step_attempts_count', { workflow: 'summaries', step: 'summarize' })).toBe(0);
  });

  it('a triage run: one start, one done finish, three step durations, each step committed at its first attempt', async () => {
    const w = await worker();
    const s = w.app.getHttpServer();
    await start();
    expect(await drain(w)).toEqual(['done', 'done', 'done']);
    expect(model.calls).toBe(2);

    expect(await started(s)).toBe(1);
    expect(await finished(s, 'done')).toBe(1);
    expect(await finished(s, 'failed')).toBe(0);
    for (const step of STEPS) {
      expect(await durations(s, step, 'done')).toBe(1);
      expect(await durations(s, step, 'duplicate')).toBe(0);
      expect(await attempts(s, step)).toEqual({ count: 1, sum: 1 });
      expect(await metricSample(s, 'workflow_step_attempts_bucket', { workflow: 'triage', step, le: '1' })).toBe(1);
    }
    // The other workflow's are untouched.
    expect(await metricSample(s, 'workflow_runs_started_total', { workflow: 'summaries' })).toBe(0);
  });

  it('a model 400 in the second step: the run counts failed, not done, and that step a failed delivery', async () => {
    const w = await worker();
    const s = w.app.getHttpServer();
    model.reply = (n, text) => (text.startsWith('Category:') ? { kind: 'error', status: 400 } : answering(n, text));
    const runId = await start();
    expect(await drain(w)).toEqual(['done', 'dead_lettered']);
    expect(await db.query('SELECT status FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([
      { status: 'failed' },
    ]);

    expect(await started(s)).toBe(1);
    expect(await finished(s, 'failed')).toBe(1);
    expect(await finished(s, 'done')).toBe(0);
    expect(await durations(s, 'classify', 'done')).toBe(1);
    expect(await durations(s, 'draft', 'failed')).toBe(1);
    expect(await durations(s, 'draft', 'done')).toBe(0);
    expect(await durations(s, 'notify', 'done')).toBe(0);
    expect(await attempts(s, 'classify')).toEqual({ count: 1, sum: 1 });
    expect(await attempts(s, 'draft')).toEqual({ count: 0, sum: 0 });
    // The workflows queue's dead letter, by queue and partition.
    expect(await metricSample(s, 'queue_dead_letter_length', { queue: 'workflows' })).toBe(1);
    expect(await metricSample(s, 'queue_dead_letter_partition_length', { queue: 'workflows', partition: '0' })).toBe(1);
    expect(await metricSample(s, 'jobs_dead_letter_length')).toBe(0); // summaries' own, unchanged
  });

  it('input refused before its first begin fails the run without a start; a malformed entry is no run', async () => {
    const w = await worker();
    const s = w.app.getHttpServer();
    const good = JSON.stringify({ ticket_id: 'T-1', text: TEXT, notify: 'agent@example.com' });
    await redis.xadd(P.jobs, '*', 'job_id', 'not-a-uuid', 'tenant', 'tenant-a', 'payload', good, 'workflow', 'triage');
    const invalid = jobIdFor(`tenant-a:POST:/v1/triage:${randomUUID()}`);
    const bad = JSON.stringify({ ticket_id: '', text: TEXT, notify: 'not an email' });
    await redis.xadd(
      P.jobs,
      '*',
      ...stepEntryFields({ runId: invalid, tenant: 'tenant-a', payload: bad, workflow: 'triage' }),
    );
    expect(await drain(w)).toEqual(['dead_lettered', 'dead_lettered']);
    expect(await redis.xlen(P.dead)).toBe(2);

    expect(await finished(s, 'failed')).toBe(1); // the invalid input's run; the malformed entry has none
    expect(await started(s)).toBe(0);
    expect(await durations(s, 'classify', 'failed')).toBe(2);
    expect(model.calls).toBe(0);
  });

  it('a step left for a redelivery: a transient delivery, then its commit at attempt 2; one start all the same', async () => {
    // One model attempt per delivery: a 503 leaves the step pending, redelivered after CLAIM_IDLE_MS. A minute, so
    // that no turn of the drain below redelivers it however slow the machine (the consumer scans for it at every
    // turn); the test then makes it idle that long.
    const w = await workers.start({ LLM_MAX_ATTEMPTS: '1', CLAIM_IDLE_MS: '60000' }, { reclaimIntervalMs: 0 });
    const s = w.app.getHttpServer();
    let failed = false;
    model.reply = (n, text) => {
      if (failed) return answering(n, text);
      failed = true;
      return { kind: 'error', status: 503 };
    };
    await start();
    expect(await drain(w)).toEqual(['transient']);
    expect(await durations(s, 'classify', 'transient')).toBe(1);
    expect(await attempts(s, 'classify')).toEqual({ count: 0, sum: 0 });

    // Reclaimed once idle past CLAIM_IDLE_MS: its idle time set a second past it (XCLAIM ... IDLE JUSTID, its
    // delivery not counted), as a minute gone by would.
    const [[id, consumer]] = (await redis.xpending(P.jobs, GROUP, '-', '+', 10)) as [string, string][];
    await redis.call('XCLAIM', P.jobs, GROUP, consumer, 0, id, 'IDLE', 61_000, 'JUSTID');
    const reclaimed = await w.consumer.runOnce();
    expect(reclaimed.map((r) => [r.deliveries, r.outcome])).toEqual([[2, 'done']]);
    expect(await drain(w)).toEqual(['done', 'done']);

    expect(await started(s)).toBe(1);
    expect(await finished(s, 'done')).toBe(1);
    expect(await durations(s, 'classify', 'done')).toBe(1);
    expect(await attempts(s, 'classify')).toEqual({ count: 1, sum: 2 });
    expect(await attempts(s, 'draft')).toEqual({ count: 1, sum: 1 });
  });

  it('the workflows queue has its depth gauges, by queue and partition; the summaries gauges keep their names', async () => {
    const w = await worker();
    const s = w.app.getHttpServer();
    expect(await metricSample(s, 'queue_stream_length', { queue: 'workflows' })).toBe(0);
    expect(await metricSample(s, 'queue_stream_length', { queue: 'summaries' })).toBe(0);
    await start();
    await start();
    // A consumer reads one of them and dies: pending.
    await redis.xgroup('CREATE', P.jobs, GROUP, '0', 'MKSTREAM');
    await redis.xreadgroup('GROUP', GROUP, 'dead-consumer', 'COUNT', 1, 'STREAMS', P.jobs, '>');

    expect(await metricSample(s, 'queue_stream_length', { queue: 'workflows' })).toBe(2);
    expect(await metricSample(s, 'queue_stream_pending', { queue: 'workflows' })).toBe(1);
    expect(await metricSample(s, 'queue_dead_letter_length', { queue: 'workflows' })).toBe(0);
    expect(await metricSample(s, 'queue_stream_partition_length', { queue: 'workflows', partition: '0' })).toBe(2);
    expect(await metricSample(s, 'queue_stream_partition_pending', { queue: 'workflows', partition: '0' })).toBe(1);
    expect(await metricSample(s, 'queue_stream_length', { queue: 'summaries' })).toBe(0);
    // The summaries series, as alerts read them: unlabelled totals, and by partition alone (all six) ...
    for (const name of ['jobs_stream_length', 'jobs_stream_pending', 'jobs_dead_letter_length']) {
      expect(await metricSample(s, name)).toBe(0);
      expect(await metricSample(s, name.replace(/_(length|pending)$/, '_partition_$1'), { partition: '0' })).toBe(0);
    }
    // ... and not a second time by queue and partition.
    expect(await metricSample(s, 'queue_stream_partition_length', { queue: 'summaries', partition: '0' })).toBe(
      undefined,
    );

    // The other one runs: the depth goes down as steps are acked.
    expect(await drain(w)).toEqual(['done', 'done', 'done']);
    expect(await metricSample(s, 'queue_stream_length', { queue: 'workflows' })).toBe(1);
    expect(await metricSample(s, 'queue_stream_pending', { queue: 'workflows' })).toBe(1);
  });

  it('a run counts failed only once its dead letter is written, where the dead letters are counted', async () => {
    const w = await worker();
    const s = w.app.getHttpServer();
    model.reply = (n, text) => (text.startsWith('Category:') ? { kind: 'error', status: 400 } : answering(n, text));
    await start();
    expect((await w.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    // The dead-letter key is no stream (set after the turn's reclaim, which checks it): the MULTI's XADD is
    // refused (WRONGTYPE), the dead letter not written. (Its XACK and XDEL still ran, a MULTI not being rolled
    // back: the entry is gone without a dead letter, a fault of ConsumerGroup.deadLetter beyond these metrics.)
    await redis.set(P.dead, 'not a stream');
    expect(await drain(w)).toEqual(['transient']);
    expect(await metricSample(s, 'worker_dead_letters_total', { reason: 'llm_client' })).toBe(0);
    expect(await finished(s, 'failed')).toBe(0);
    expect(await durations(s, 'draft', 'failed')).toBe(1); // the delivery failed for good all the same

    await redis.del(P.dead);
    await start();
    expect(await drain(w)).toEqual(['done', 'dead_lettered']);
    expect(await redis.xlen(P.dead)).toBe(1);
    expect(await metricSample(s, 'worker_dead_letters_total', { reason: 'llm_client' })).toBe(1);
    expect(await finished(s, 'failed')).toBe(1);
  });

  it("the consumer's max_deliveries: a run counts failed once PostgreSQL marks it; a run done already does not", async () => {
    const w = await worker({ MAX_DELIVERIES: '1', CLAIM_IDLE_MS: '100' });
    const s = w.app.getHttpServer();
    /** A consumer reads the entry and dies: the next claim finds it past MAX_DELIVERIES and dead-letters it. */
    const readByADeadConsumer = async () => {
      await redis.xgroup('CREATE', P.jobs, GROUP, '0', 'MKSTREAM').catch(() => undefined);
      await redis.xreadgroup('GROUP', GROUP, 'dead-consumer', 'COUNT', 1, 'STREAMS', P.jobs, '>');
    };
    const deadLettered = (n: number) =>
      eventually(async () => {
        await w.consumer.runOnce();
        return (await redis.xlen(P.dead)) === n ? true : undefined;
      }, 10_000);

    // A done run whose last step's entry comes back (its ack lost, say) and is dead-lettered.
    const done = await startTriageRun(redis);
    expect(await drain(w)).toEqual(['done', 'done', 'done']);
    expect(await finished(s, 'done')).toBe(1);
    const payload = JSON.stringify(done.input);
    await redis.xadd(
      P.jobs,
      '*',
      ...stepEntryFields({ runId: done.runId, tenant: 'tenant-a', payload, workflow: 'triage', step: 'notify' }),
    );
    await readByADeadConsumer();
    await deadLettered(1);

    // A run whose first step never got further than a consumer that died.
    const stuck = await start();
    await readByADeadConsumer();
    await deadLettered(2);
    await eventually(async () => ((await finished(s, 'failed')) === 1 ? true : undefined), 5000, 'one failed run');
    expect(await db.query('SELECT run_id, status FROM workflow_runs ORDER BY status')).toEqual([
      { run_id: done.runId, status: 'done' },
      { run_id: stuck, status: 'failed' },
    ]);
    expect(await finished(s, 'failed')).toBe(1); // the done run's dead letter counted nothing
    expect(await metricSample(s, 'worker_dead_letters_total', { reason: 'max_deliveries' })).toBe(2);
  });

  it('a begin that finds the run row another writer inserted meanwhile starts no run', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '100' });
    const s = w.app.getHttpServer();
    const runId = await start();
    // A consumer read it and died: the worker's delivery is a reclaim (delivery 2), which begins before it runs.
    await redis.xgroup('CREATE', P.jobs, GROUP, '0', 'MKSTREAM').catch(() => undefined);
    await redis.xreadgroup('GROUP', GROUP, 'dead-consumer', 'COUNT', 1, 'STREAMS', P.jobs, '>');
    // Another writer (a dead letter's mark, say) inserts the run row failed, and has not committed when begin runs.
    const other = db.createQueryRunner();
    await other.connect();
    await other.startTransaction();
    await other.query(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, finished_at)
       VALUES ($1, 'triage', 'tenant-a', 'failed', ARRAY['classify', 'draft', 'notify'], 'elsewhere', now())`,
      [runId],
    );
    const turn = eventually(async () => {
      const ran = await w.consumer.runOnce();
      return ran.length > 0 ? ran : undefined;
    }, 10_000);
    // Begin's statement has its snapshot and waits on that row's insert.
    await eventually(async () => {
      const [{ n }] = await db.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH input AS%'`,
      );
      return n > 0 ? true : undefined;
    });
    await other.commitTransaction();
    await other.release();
    expect((await turn).map((r) => r.outcome)).toEqual(['done']);
    expect(await drain(w)).toEqual(['done', 'done']);
    // The row was there (updated from failed to running, not inserted): no start, one finish.
    expect(await started(s)).toBe(0);
    expect(await finished(s, 'done')).toBe(1);
  });

  it('a workflow on a queue of its own has its depth gauges, by queue and partition', async () => {
    const w = await workers.start({}, {}, [LedgerModule]);
    const s = w.app.getHttpServer();
    const [ledger] = new QueueLayout('ledger', 1).partitions;
    await redis.xadd(
      ledger.jobs,
      '*',
      ...stepEntryFields({ runId: randomUUID(), tenant: 'tenant-a', payload: '{}', workflow: 'ledger' }),
    );
    expect(await metricSample(s, 'queue_stream_length', { queue: 'ledger' })).toBe(1);
    expect(await metricSample(s, 'queue_stream_pending', { queue: 'ledger' })).toBe(0);
    expect(await metricSample(s, 'queue_dead_letter_length', { queue: 'ledger' })).toBe(0);
    expect(await metricSample(s, 'queue_stream_partition_length', { queue: 'ledger', partition: '0' })).toBe(1);
    expect(await metricSample(s, 'workflow_runs_started_total', { workflow: 'ledger' })).toBe(0);
    expect(await drain(w)).toEqual(['done']);
    expect(await metricSample(s, 'queue_stream_length', { queue: 'ledger' })).toBe(0);
    expect(await metricSample(s, 'workflow_runs_finished_total', { workflow: 'ledger', status: 'done' })).toBe(1);
  });

  it("each queue's gauges are read on their own: one that fails keeps its figures, the others move", async () => {
    // The registry's queues in another order than the worker's: summaries' unlabelled series are found by name.
    const queue = (name: string): WorkflowQueue => ({
      name,
      group: name,
      layout: new QueueLayout(name, 2),
      shared: false,
      workflows: new Map(),
    });
    const [workflows, summaries] = [queue('workflows'), queue('summaries')];
    const registry = new Registry();
    new QueueGauges(registry, new WorkflowRegistry([workflows, summaries]), redis);
    const sample = async (name: string, labels: Record<string, string> = {}) => {
      const text = await registry.metrics();
      const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
      const line = text
        .split('\n')
        .find(
          (l) =>
            l.split(/[{ ]/)[0] === name && want.every((x) => l.includes(x)) && (want.length > 0 || !l.includes('{')),
        );
      return line === undefined ? undefined : Number(line.split(' ').pop());
    };
    await redis.xadd(workflows.layout.partitions[0].jobs, '*', 'k', 'v');
    expect(await sample('queue_stream_length', { queue: 'workflows' })).toBe(1);
    expect(await sample('jobs_stream_length')).toBe(0);

    // The workflows queue cannot be read (its dead-letter key is not a stream); summaries fills up.
    await redis.set(workflows.layout.partitions[1].dead, 'not a stream');
    await redis.xadd(workflows.layout.partitions[0].jobs, '*', 'k', 'v');
    await redis.xadd(summaries.layout.partitions[1].jobs, '*', 'k', 'v');
    await redis.xadd(summaries.layout.partitions[1].jobs, '*', 'k', 'v');
    expect(await sample('queue_stream_length', { queue: 'workflows' })).toBe(1); // its last figures
    expect(await sample('queue_stream_length', { queue: 'summaries' })).toBe(2);
    expect(await sample('jobs_stream_length')).toBe(2);
    expect(await sample('jobs_stream_partition_length', { partition: '1' })).toBe(2);
    // Summaries' partitions are the jobs_ series only; the other queues' have theirs by queue.
    expect(await sample('queue_stream_partition_length', { queue: 'summaries' })).toBe(undefined);
    expect(await sample('queue_stream_partition_length', { queue: 'workflows', partition: '0' })).toBe(1);
  });
});
