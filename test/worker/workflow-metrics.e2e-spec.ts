import { jobIdFor } from '@app/summary-queue';
import { QueueLayout, stepEntryFields } from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { metricSample, metricValue } from '../support/metrics';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/*
 * The workflow metrics (libs/workflows/src/workflow.metrics.ts) and the queue
 * gauges of every operated queue (apps/worker/src/consumer/queue.gauges.ts),
 * read from the real worker module's /metrics while the triage workflow runs
 * on Redis Streams and PostgreSQL, the fake model behind the real openai SDK.
 * Runs are started as the api's client starts them (the run's record and its
 * first entry on `{workflows}:jobs`), as in triage-workflow.e2e-spec.ts.
 */
const QUEUE = new QueueLayout('workflows', 1);
const [P] = QUEUE.partitions;
const GROUP = 'workflows';
const STEPS = ['classify', 'draft', 'notify'] as const;
const TEXT = 'My invoice for March was charged twice. Please refund the second charge of 49 EUR.';

describe('workflow metrics and queue gauges', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  const workers: WorkerHarness[] = [];

  const worker = async (env: Record<string, string> = {}) => {
    const w = await startWorker({ modelUrl: model.baseUrl, env });
    workers.push(w);
    return w;
  };
  const start = async (): Promise<string> => {
    const runId = jobIdFor(`tenant-a:POST:/v1/triage:${randomUUID()}`);
    await redis.hset(P.jobRecordKey(runId), 'tenant', 'tenant-a', 'workflow', 'triage', 'accepted_at', Date.now());
    const input = { ticket_id: 'T-1', text: TEXT, notify: 'agent@example.com' };
    await redis.xadd(
      P.jobs,
      '*',
      ...stepEntryFields({ runId, tenant: 'tenant-a', payload: JSON.stringify(input), workflow: 'triage' }),
    );
    return runId;
  };
  const drain = async (w: WorkerHarness) => {
    const outcomes: string[] = [];
    for (let turn = 0; turn < 20; turn++) {
      const ran = await w.consumer.runOnce();
      if (ran.length === 0) break;
      outcomes.push(...ran.map((r) => r.outcome));
    }
    return outcomes;
  };
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
    await Promise.all(workers.splice(0).map((w) => w.close()));
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
      expect(await metricValue(s, 'workflow_step_attempts_bucket', { workflow: 'triage', step, le: '1' })).toBe(1);
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
    expect(await metricValue(s, 'queue_dead_letter_length', { queue: 'workflows' })).toBe(1);
    expect(await metricValue(s, 'queue_dead_letter_partition_length', { queue: 'workflows', partition: '0' })).toBe(1);
    expect(await metricValue(s, 'jobs_dead_letter_length')).toBe(0); // summaries' own, unchanged
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
    // One model attempt per delivery: a 503 leaves the step pending, redelivered after CLAIM_IDLE_MS.
    const w = await worker({ LLM_MAX_ATTEMPTS: '1', CLAIM_IDLE_MS: '200' });
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

    // Reclaimed once idle past CLAIM_IDLE_MS (the consumer's own rule, polled: no fixed wait).
    const reclaimed = await eventually(async () => {
      const ran = await w.consumer.runOnce();
      return ran.length > 0 ? ran : undefined;
    }, 10_000);
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

    expect(await metricValue(s, 'queue_stream_length', { queue: 'workflows' })).toBe(2);
    expect(await metricValue(s, 'queue_stream_pending', { queue: 'workflows' })).toBe(1);
    expect(await metricValue(s, 'queue_dead_letter_length', { queue: 'workflows' })).toBe(0);
    expect(await metricValue(s, 'queue_stream_partition_length', { queue: 'workflows', partition: '0' })).toBe(2);
    expect(await metricValue(s, 'queue_stream_partition_pending', { queue: 'workflows', partition: '0' })).toBe(1);
    expect(await metricValue(s, 'queue_stream_length', { queue: 'summaries' })).toBe(0);
    // The summaries series, as alerts read them: unlabelled totals, and by partition alone.
    expect(await metricSample(s, 'jobs_stream_length')).toBe(0);
    expect(await metricSample(s, 'jobs_stream_pending')).toBe(0);
    expect(await metricSample(s, 'jobs_dead_letter_length')).toBe(0);
    expect(await metricSample(s, 'jobs_stream_partition_length', { partition: '0' })).toBe(0);

    // The other one runs: the depth goes down as steps are acked.
    expect(await drain(w)).toEqual(['done', 'done', 'done']);
    expect(await metricValue(s, 'queue_stream_length', { queue: 'workflows' })).toBe(1);
    expect(await metricValue(s, 'queue_stream_pending', { queue: 'workflows' })).toBe(1);
  });
});
