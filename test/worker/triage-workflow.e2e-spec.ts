import { Injectable, Module, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { jobIdFor } from '@app/summary-queue';
import {
  entryFieldMap,
  Step,
  type StepContext,
  stepEntryFields,
  Workflow,
  WorkflowHandler,
  type StreamMessage,
} from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { loadWorkerConfig } from '../../apps/worker/src/worker.config';
import { WorkerModule } from '../../apps/worker/src/worker.module';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually, freshRedis, testDatabaseUrl, testDataSource, testRedisUrl, truncateAll } from '../support/infra';
import { idlePast as idleAtLeast } from '../support/pending-entries';
import { drain, startTriageRun, TRIAGE_TEXT, WORKFLOWS, WORKFLOWS_GROUP, workerPool } from '../support/triage-runs';

/*
 * The triage workflow (apps/worker/src/workflows/triage.workflow.ts) on the
 * engine, through the real worker module: Redis Streams, PostgreSQL, and the
 * fake model behind the real openai SDK. A run is started as the api's
 * client starts one: the run's record and its first entry on `{workflows}:jobs`.
 */
const [P] = WORKFLOWS.partitions;
const GROUP = WORKFLOWS_GROUP;
const TEXT = TRIAGE_TEXT;

describe('the triage workflow on the engine', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  const workers = workerPool(() => model.baseUrl);
  const worker = workers.start;
  const start = (input?: Record<string, unknown>, extra?: Record<string, string>) =>
    startTriageRun(redis, input, extra);
  const rows = (sql: string, params: unknown[] = []) => db.query(sql, params);
  const count = async (sql: string, params: unknown[] = []) => Number((await rows(sql, params))[0].n);
  const pending = async () => Number(((await redis.xpending(P.jobs, GROUP)) as [number])[0]);
  /** Until every entry pending in the group is claimable by a CLAIM_IDLE_MS of `ms`. */
  const idlePast = (ms: number) => idleAtLeast(redis, P.jobs, GROUP, ms);
  const deadLetters = async () => (await redis.xrange(P.dead, '-', '+')).map(([, flat]) => entryFieldMap(flat));
  /** The model answers the classification with `category` (untrimmed) and the draft with a reply. */
  const answering =
    (category = '  billing \n') =>
    (_n: number, text: string): ModelReply =>
      text.startsWith('Category:')
        ? { kind: 'complete', content: 'Dear customer, we are refunding the second charge.' }
        : { kind: 'complete', content: category };

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
    model.peakConcurrency = 0;
    model.reply = answering();
  });
  afterEach(async () => {
    await workers.closeAll();
    redis.disconnect();
  });

  it('runs the three steps: two model calls, one outbox row, the run done with its output, the stream empty', async () => {
    const w = await worker();
    const { runId } = await start();
    expect(await drain(w)).toEqual(['done', 'done', 'done']);

    expect(model.calls).toBe(2);
    expect(model.requests[0].userText).toContain(TEXT);
    expect(model.requests[1].userText).toContain('billing');
    expect(model.requests[1].userText).toContain(TEXT);
    // Each call's key names the run, the step and the call's place in it.
    expect(model.requests.map((r) => r.headers['idempotency-key'])).toEqual([
      expect.stringMatching(new RegExp(`^wf:${runId}:classify:0:[0-9a-f]{16}$`)),
      expect.stringMatching(new RegExp(`^wf:${runId}:draft:0:[0-9a-f]{16}$`)),
    ]);
    expect(await rows('SELECT topic, dedupe_key, payload FROM outbox')).toEqual([
      {
        topic: 'email.triage_ready',
        dedupe_key: `triage_ready:${runId}`,
        payload: { run_id: runId, to: 'agent@example.com', category: 'billing' },
      },
    ]);
    expect(
      await rows(
        'SELECT workflow, tenant, status, steps, output, error, finished_at IS NOT NULL AS finished FROM workflow_runs',
      ),
    ).toEqual([
      {
        workflow: 'triage',
        tenant: 'tenant-a',
        status: 'done',
        steps: ['classify', 'draft', 'notify'],
        output: { category: 'billing', draft: 'Dear customer, we are refunding the second charge.' },
        error: null,
        finished: true,
      },
    ]);
    expect(await rows('SELECT step, status, attempts, output FROM workflow_steps ORDER BY started_at, step')).toEqual([
      { step: 'classify', status: 'done', attempts: 1, output: { category: 'billing' } },
      {
        step: 'draft',
        status: 'done',
        attempts: 1,
        output: { draft: 'Dear customer, we are refunding the second charge.' },
      },
      { step: 'notify', status: 'done', attempts: 1, output: null },
    ]);
    expect(await redis.xlen(P.jobs)).toBe(0);
    expect(await pending()).toBe(0);
    expect(await redis.xlen(P.dead)).toBe(0);
  });

  it('a step committed by a worker that died before its ack is not run again, and the next step runs once', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '200' });
    const { runId } = await start();
    await redis.xgroup('CREATE', P.jobs, GROUP, '0', 'MKSTREAM');
    // A worker reads the first entry and runs its step to the commit, then dies before the ack's MULTI
    // (the handler hands that MULTI to the consumer, which never gets to run it here).
    const reply = (await redis.xreadgroup('GROUP', GROUP, 'dead-worker', 'COUNT', 1, 'STREAMS', P.jobs, '>')) as [
      string,
      [string, string[]][],
    ][];
    const [id, flat] = reply[0][1][0];
    const message: StreamMessage = { id, fields: entryFieldMap(flat) };
    const result = await w.app.get(WorkflowHandler).process(message, {
      source: { queue: 'workflows', partition: 0 },
      delivery: 1,
      deadline: performance.now() + 10_000,
      stopRetrying: new AbortController().signal,
      signal: new AbortController().signal,
    });
    expect(result.outcome).toBe('done');
    expect(model.calls).toBe(1);
    expect(await rows(`SELECT step, status FROM workflow_steps`)).toEqual([{ step: 'classify', status: 'done' }]);
    expect(await pending()).toBe(1);

    await idlePast(200); // the dead worker's entry is now idle past CLAIM_IDLE_MS
    const reclaimed = await w.consumer.runOnce();
    expect(reclaimed).toEqual([{ id, deliveries: 2, outcome: 'duplicate' }]);
    expect(model.calls).toBe(1); // the committed step was not run again
    expect(await drain(w)).toEqual(['done', 'done']);
    expect(model.calls).toBe(2); // draft, once
    expect(await rows('SELECT step, attempts FROM workflow_steps ORDER BY started_at, step')).toEqual([
      { step: 'classify', attempts: 1 },
      { step: 'draft', attempts: 1 },
      { step: 'notify', attempts: 1 },
    ]);
    expect(await count('SELECT count(*) AS n FROM outbox')).toBe(1);
    expect(await rows('SELECT status, output FROM workflow_runs WHERE run_id = $1', [runId])).toEqual([
      { status: 'done', output: { category: 'billing', draft: 'Dear customer, we are refunding the second charge.' } },
    ]);
    expect(await redis.xlen(P.jobs)).toBe(0);
    expect(await pending()).toBe(0);
  });

  it('a model 400 fails the run and dead-letters the step with its fields, after one call', async () => {
    const w = await worker();
    model.reply = (n, text) => (text.startsWith('Category:') ? { kind: 'error', status: 400 } : answering()(n, text));
    const { runId, input } = await start();
    expect(await drain(w)).toEqual(['done', 'dead_lettered']);
    expect(model.calls).toBe(2);
    const [dead, ...more] = await deadLetters();
    expect(more).toEqual([]);
    expect(dead).toMatchObject({
      job_id: runId,
      tenant: 'tenant-a',
      payload: JSON.stringify(input),
      workflow: 'triage',
      step: 'draft',
      state: JSON.stringify({ classify: { category: 'billing' } }),
      reason: 'llm_client',
    });
    expect(
      await rows(
        'SELECT status, error IS NOT NULL AS has_error, finished_at IS NOT NULL AS finished FROM workflow_runs',
      ),
    ).toEqual([{ status: 'failed', has_error: true, finished: true }]);
    expect(await rows('SELECT step, status, attempts FROM workflow_steps ORDER BY started_at, step')).toEqual([
      { step: 'classify', status: 'done', attempts: 1 },
      { step: 'draft', status: 'failed', attempts: 1 },
    ]);
    expect(await redis.hgetall(P.jobRecordKey(runId))).toMatchObject({ status: 'failed', error: 'llm_client' });
    expect(await count('SELECT count(*) AS n FROM outbox')).toBe(0);
    expect(await redis.xlen(P.jobs)).toBe(0);
    expect(await pending()).toBe(0);
  });

  it.each<[string, ModelReply]>([
    ['a 503', { kind: 'error', status: 503 }],
    ['a 429 with Retry-After', { kind: 'error', status: 429, headers: { 'retry-after': '1' } }],
  ])('%s is retried within the step, under the same Idempotency-Key', async (_, failure) => {
    const w = await worker();
    let failed = false;
    model.reply = (n, text) => {
      if (!failed) {
        failed = true;
        return failure;
      }
      return answering()(n, text);
    };
    const { runId } = await start();
    expect(await drain(w)).toEqual(['done', 'done', 'done']);
    expect(model.calls).toBe(3);
    expect(model.requests.map((r) => r.headers['idempotency-key'])).toEqual([
      expect.stringMatching(new RegExp(`^wf:${runId}:classify:0:[0-9a-f]{16}$`)),
      expect.stringMatching(new RegExp(`^wf:${runId}:classify:0:[0-9a-f]{16}$`)),
      expect.stringMatching(new RegExp(`^wf:${runId}:draft:0:[0-9a-f]{16}$`)),
    ]);
    // The retried call is the same request: the same key, digest included.
    expect(model.requests[1].headers['idempotency-key']).toBe(model.requests[0].headers['idempotency-key']);
    expect(await rows('SELECT step, attempts FROM workflow_steps ORDER BY started_at, step')).toEqual([
      { step: 'classify', attempts: 1 },
      { step: 'draft', attempts: 1 },
      { step: 'notify', attempts: 1 },
    ]);
    expect(await rows('SELECT status FROM workflow_runs')).toEqual([{ status: 'done' }]);
  });

  it('bad entries are dead-lettered at once with a clear reason, never run and never retried', async () => {
    const w = await worker({ CLAIM_IDLE_MS: '100' });
    const runId = () => jobIdFor(`tenant-a:POST:/v1/triage:${randomUUID()}`);
    const good = JSON.stringify({ ticket_id: 'T-1', text: TEXT, notify: 'agent@example.com' });
    await redis.xadd(P.jobs, '*', 'job_id', 'not-a-uuid', 'tenant', 'tenant-a', 'payload', good, 'workflow', 'triage');
    const unknownStep = runId();
    await redis.xadd(
      P.jobs,
      '*',
      ...stepEntryFields({
        runId: unknownStep,
        tenant: 'tenant-a',
        payload: good,
        workflow: 'triage',
        step: 'escalate',
      }),
    );
    const unknownWorkflow = runId();
    await redis.xadd(
      P.jobs,
      '*',
      ...stepEntryFields({ runId: unknownWorkflow, tenant: 'tenant-a', payload: good, workflow: 'refund' }),
    );
    const invalid = await start({ ticket_id: '', text: TEXT, notify: 'not an email' });
    const notJson = runId();
    await redis.xadd(P.jobs, '*', 'job_id', notJson, 'tenant', 'tenant-a', 'payload', '{', 'workflow', 'triage');

    expect(await drain(w)).toEqual(Array(5).fill('dead_lettered'));
    // Anything left pending is claimable once idle past CLAIM_IDLE_MS (nothing pending: at once); none may come back.
    await idlePast(100);
    expect(await drain(w)).toEqual([]);
    expect(model.calls).toBe(0);
    const dead = await deadLetters();
    // In the order their deliveries finished: those that marked their run failed in PostgreSQL first came later.
    const byRun = new Map(dead.map((d) => [d.job_id, d]));
    expect(dead.map((d) => [d.job_id, d.reason]).sort()).toEqual(
      [
        ['not-a-uuid', 'malformed'],
        [unknownStep, 'unknown_step'],
        [unknownWorkflow, 'unknown_workflow'],
        [invalid.runId, 'invalid_input'],
        [notJson, 'malformed'],
      ].sort(),
    );
    expect(byRun.get(unknownStep)?.detail).toMatch(/no step escalate/);
    expect(byRun.get(invalid.runId)?.detail).toMatch(/ticket_id/);
    expect(byRun.get(invalid.runId)?.detail).toMatch(/notify must be an email/);
    expect(await rows('SELECT run_id, status, error FROM workflow_runs ORDER BY run_id')).toEqual(
      [
        { run_id: unknownStep, status: 'failed', error: expect.stringMatching(/unknown_step|no step/) },
        { run_id: invalid.runId, status: 'failed', error: expect.stringMatching(/invalid input/) },
      ].sort((a, b) => a.run_id.localeCompare(b.run_id)),
    );
    expect(await redis.hgetall(P.jobRecordKey(invalid.runId))).toMatchObject({
      status: 'failed',
      error: 'invalid_input',
    });
    expect(await pending()).toBe(0);
    expect(await redis.xlen(P.jobs)).toBe(0);
  });

  it('50 runs at once: every one done, each step once, one outbox row each', async () => {
    const w = await worker({ WORKER_CONCURRENCY: '16' }, { blockMs: 100 });
    model.reply = (n, text) => ({ ...(answering()(n, text) as { kind: 'complete'; content: string }), delayMs: 5 });
    const runs = await Promise.all(Array.from({ length: 50 }, () => start()));
    w.consumer.start();
    await eventually(
      async () =>
        (await count(`SELECT count(*) AS n FROM workflow_runs WHERE status = 'done'`)) === 50 ? true : undefined,
      30_000,
      '50 runs done',
    );
    expect(model.calls).toBe(100);
    expect(await count('SELECT count(*) AS n FROM workflow_steps')).toBe(150);
    expect(await count(`SELECT count(*) AS n FROM workflow_steps WHERE status <> 'done' OR attempts <> 1`)).toBe(0);
    expect(
      (await rows('SELECT dedupe_key FROM outbox')).map((r: { dedupe_key: string }) => r.dedupe_key).sort(),
    ).toEqual(runs.map((r) => `triage_ready:${r.runId}`).sort());
    // Each model call once: one per run and step.
    const keys = model.requests.map((r) => r.headers['idempotency-key']);
    expect(keys).toHaveLength(100);
    expect(new Set(keys).size).toBe(keys.length);
    await eventually(async () => ((await redis.xlen(P.jobs)) === 0 ? true : undefined), 5000, 'the stream empty');
    expect(await pending()).toBe(0);
  });

  describe('a name registered twice stops the start', () => {
    const config = () =>
      loadWorkerConfig({
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        LOG_LEVEL: 'silent',
        LLM_PROVIDER: 'fake',
      });
    const boot = async (extra: Type<unknown>) => {
      const moduleRef = await Test.createTestingModule({
        imports: [WorkerModule.forRoot(config(), { autoStart: false }), extra],
      }).compile();
      const app = moduleRef.createNestApplication({ bufferLogs: true });
      app.useLogger(false);
      try {
        await app.init();
      } finally {
        await app.close().catch(() => undefined);
      }
    };

    it('a second workflow named triage', async () => {
      @Workflow('triage')
      @Injectable()
      class AnotherTriage {
        @Step()
        only(): void {}
      }
      @Module({ providers: [AnotherTriage] })
      class Extra {}
      await expect(boot(Extra)).rejects.toThrow(
        /workflow "triage" is registered twice: by TriageWorkflow and AnotherTriage/,
      );
    });

    it("a workflow on another workflow's own queue", async () => {
      @Workflow('intruder', { queue: 'summaries', group: 'summarizers' })
      @Injectable()
      class Intruder {
        @Step()
        only(): void {}
      }
      @Module({ providers: [Intruder] })
      class Extra {}
      await expect(boot(Extra)).rejects.toThrow(/workflows "summaries" and "intruder" both name queue "summaries"/);
    });

    it('two steps of one name in one workflow', async () => {
      @Workflow('twice')
      @Injectable()
      class Twice {
        @Step({ name: 'same' })
        first(ctx: StepContext): void {
          void ctx;
        }
        @Step({ name: 'same' })
        second(): void {}
      }
      @Module({ providers: [Twice] })
      class Extra {}
      await expect(boot(Extra)).rejects.toThrow(/workflow "twice" \(Twice\): step "same" is declared twice/);
    });
  });
});
