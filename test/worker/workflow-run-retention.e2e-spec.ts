import { HealthChecksRegistry } from '@app/health';
import {
  RETENTION_LOOP,
  WorkflowRunRetention,
  workflowRunRetentionProviders,
  type WorkflowRunRetentionOptions,
} from '@app/workflows';
import { Test } from '@nestjs/testing';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { testDataSource } from '../support/infra';

describe('retention of finished workflow runs (WORKFLOW_RUN_RETENTION_DAYS)', () => {
  let db: DataSource;
  beforeAll(async () => {
    db = await testDataSource();
  });
  afterAll(() => db.destroy());
  beforeEach(() => db.query('TRUNCATE workflow_runs CASCADE'));

  /** A run with two steps; ages in days before now() (null: not set). */
  const run = async (
    label: string,
    status: 'running' | 'done' | 'failed',
    finishedDaysAgo: number | null,
    createdDaysAgo = (finishedDaysAgo ?? 0) + 1,
  ) => {
    const runId = randomUUID();
    await db.query(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, created_at, updated_at, finished_at)
       VALUES ($1, 'triage', 't', $2, '{classify,draft}', $3,
               now() - $4::integer * interval '1 day', now() - $4::integer * interval '1 day',
               CASE WHEN $5::integer IS NULL THEN NULL ELSE now() - $5::integer * interval '1 day' END)`,
      [runId, status, label, createdDaysAgo, finishedDaysAgo],
    );
    await db.query(
      `INSERT INTO workflow_steps (run_id, step, status, attempts) VALUES ($1, 'classify', 'done', 1), ($1, 'draft', $2, 1)`,
      [runId, status === 'running' ? 'running' : status],
    );
    return runId;
  };
  const kept = async () =>
    (await db.query<{ error: string; steps: number }[]>(
      `SELECT r.error, (SELECT count(*)::integer FROM workflow_steps s WHERE s.run_id = r.run_id) AS steps
         FROM workflow_runs r ORDER BY r.error`,
    )) as { error: string; steps: number }[];
  const stepsLeft = async () => Number((await db.query(`SELECT count(*) AS n FROM workflow_steps`))[0].n);

  async function compile(options: WorkflowRunRetentionOptions, registry = new HealthChecksRegistry()) {
    const moduleRef = await Test.createTestingModule({
      providers: [
        ...workflowRunRetentionProviders(options),
        { provide: DataSource, useValue: db },
        { provide: HealthChecksRegistry, useValue: registry },
      ],
    }).compile();
    return { retention: moduleRef.get(WorkflowRunRetention), registry };
  }

  it('deletes finished runs older than the retention with their steps, in batches; recent and running runs stay', async () => {
    await run('old-done', 'done', 31);
    await run('old-failed', 'failed', 45);
    await run('recent-done', 'done', 29);
    await run('just-failed', 'failed', 0);
    await run('running', 'running', null, 60);
    // A failed run re-driven: running again, its old finished_at not yet cleared.
    await run('redriven', 'running', 40);
    // More than two batches' worth of old runs.
    await db.query(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, error, finished_at)
       SELECT gen_random_uuid(), 'triage', 't', 'done', '{classify}', 'bulk', now() - interval '31 days'
         FROM generate_series(1, 1050)`,
    );
    await db.query(
      `INSERT INTO workflow_steps (run_id, step, status, attempts)
       SELECT run_id, 'classify', 'done', 1 FROM workflow_runs WHERE error = 'bulk'`,
    );
    expect(await stepsLeft()).toBe(6 * 2 + 1050);

    const { retention } = await compile({ retentionDays: 30, batch: 500, pauseMs: 0, autoStart: false });
    await expect(retention.runOnce()).resolves.toBe(1050 + 2);
    expect(await kept()).toEqual([
      { error: 'just-failed', steps: 2 },
      { error: 'recent-done', steps: 2 },
      { error: 'redriven', steps: 2 },
      { error: 'running', steps: 2 },
    ]);
    expect(await stepsLeft()).toBe(8);
    await expect(retention.runOnce()).resolves.toBe(0);
  });

  it('deletes one batch per transaction: per-call counts of a small batch', async () => {
    for (let i = 0; i < 5; i++) await run(`old-${i}`, i % 2 ? 'failed' : 'done', 31 + i);
    await run('recent-done', 'done', 1);
    const { retention } = await compile({ retentionDays: 30, batch: 2, pauseMs: 0, autoStart: false });
    const counts = [];
    for (let i = 0; i < 4; i++) counts.push(await retention.deleteBatch());
    expect(counts).toEqual([2, 2, 1, 0]);
    expect(await kept()).toEqual([{ error: 'recent-done', steps: 2 }]);
  });

  it('skips a run another transaction holds (SKIP LOCKED), deletes the rest, and takes it at the next sweep', async () => {
    const held = await run('held', 'done', 40);
    await run('old-a', 'done', 31);
    await run('old-b', 'failed', 32);
    const other = db.createQueryRunner();
    await other.connect();
    try {
      await other.startTransaction();
      await other.query(`SELECT run_id FROM workflow_runs WHERE run_id = $1 FOR UPDATE`, [held]);
      const { retention } = await compile({ retentionDays: 30, batch: 1, pauseMs: 0, autoStart: false });
      await expect(retention.runOnce()).resolves.toBe(2);
      expect(await kept()).toEqual([{ error: 'held', steps: 2 }]);
      await other.commitTransaction();
      await expect(retention.runOnce()).resolves.toBe(1);
      expect(await kept()).toEqual([]);
    } finally {
      await other.release();
    }
  });

  it('gives a batch up past lock_timeout (a step row held): no error, nothing half done, the next sweep deletes it', async () => {
    const held = await run('held', 'done', 40);
    await run('old-a', 'done', 31);
    const other = db.createQueryRunner();
    await other.connect();
    try {
      await other.startTransaction();
      // A step committing holds its row: the cascade from the run waits for it, up to lock_timeout.
      await other.query(`SELECT step FROM workflow_steps WHERE run_id = $1 FOR UPDATE`, [held]);
      const { retention } = await compile({
        retentionDays: 30,
        batch: 10,
        pauseMs: 0,
        lockTimeoutMs: 50,
        autoStart: false,
      });
      await expect(retention.runOnce()).resolves.toBe(0);
      expect(await kept()).toEqual([
        { error: 'held', steps: 2 },
        { error: 'old-a', steps: 2 },
      ]);
      await other.commitTransaction();
      await expect(retention.runOnce()).resolves.toBe(2);
      expect(await kept()).toEqual([]);
    } finally {
      await other.release();
    }
  });

  it('sweeps once as it starts, reports to liveness while it runs, and leaves liveness when stopped', async () => {
    await run('old-done', 'done', 31);
    await run('recent-done', 'done', 1);
    let now = 0;
    const registry = new HealthChecksRegistry(() => now);
    const { retention } = await compile({ retentionDays: 30, maxSilenceMs: 1000 }, registry);

    retention.onApplicationBootstrap();
    // Registered and beaten at start: silent too long only past maxSilenceMs.
    expect(registry.staleLoops(1000)).toEqual([]);
    expect(registry.staleLoops(1001)).toEqual([{ name: RETENTION_LOOP, silentMs: 1001 }]);
    now = 5000;
    // The first sweep's statement is already running: stopping lets it finish, then ends the idle wait.
    await retention.beforeApplicationShutdown();
    expect(await kept()).toEqual([{ error: 'recent-done', steps: 2 }]);
    expect(registry.staleLoops(1_000_000)).toEqual([]);
  });

  it('keeps every run for ever with a retention of 0 days: no sweep, no loop', async () => {
    await run('ancient', 'done', 3000);
    const registry = new HealthChecksRegistry(() => 0);
    const { retention } = await compile({ retentionDays: 0 }, registry);
    retention.onApplicationBootstrap();
    expect(registry.staleLoops(1_000_000)).toEqual([]);
    await retention.beforeApplicationShutdown();
    expect(await kept()).toEqual([{ error: 'ancient', steps: 2 }]);
  });
});
