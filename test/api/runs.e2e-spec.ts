import { ProblemTypes } from '@app/problem';
import { jobIdFor, jobRecordKey, JOBS_STREAM } from '@app/summary-queue';
import { Controller, Global, Module, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { REDIS_CLIENT } from '@app/redis';
import {
  InjectWorkflow,
  QueueLayout,
  RunTenantMismatchError,
  WorkflowClient,
  WorkflowClientModule,
  WorkflowHandle,
  WorkflowRunsReader,
} from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { freePort, freshRedis, startRedisServer, testDataSource, truncateAll } from '../support/infra';

/*
 * GET /v1/runs/<run_id> (INTERFACE.md, "Workflows") for every run the api can
 * name: a triage run queued (its Redis record only), running, done or failed
 * (rows this test writes as the worker's engine writes them: the run's row
 * naming its steps, a row per step begun), and summaries jobs, whose job id
 * is the run id, queued or finished before workflows existed (only their
 * `summaries` row). Another tenant's run, in any state, is a 404.
 */
const STEPS = ['classify', 'draft', 'notify'];
const triageBody = { ticket_id: 'T-7', text: 'The app crashes when I pay.', notify: 'ops@example.com' };
const summaryBody = { text: 'The quick brown fox jumps over the lazy dog.', notify: 'ops@example.com' };

describe('GET /v1/runs/:runId', () => {
  let api: ApiHarness;
  let redis: Redis;
  let db: DataSource;

  beforeAll(async () => {
    redis = await freshRedis();
    db = await testDataSource();
    api = await startApi();
  });
  afterAll(async () => {
    await api.close();
    await db.destroy();
    redis.disconnect();
  });
  beforeEach(async () => {
    await redis.flushdb();
    await truncateAll(db);
    await db.query('TRUNCATE workflow_runs CASCADE');
  });

  const start = async (path: '/v1/triage' | '/v1/summaries', tenant: { key: string } = TENANT_A) => {
    const res = await request(api.server)
      .post(path)
      .set('Authorization', bearer(tenant))
      .set('Idempotency-Key', `key-${randomUUID()}`)
      .send(path === '/v1/triage' ? triageBody : summaryBody)
      .expect(202);
    return (res.body.run_id ?? res.body.job_id) as string;
  };
  const get = (runId: string, tenant: { key: string } = TENANT_A, server = api.server) =>
    request(server).get(`/v1/runs/${runId}`).set('Authorization', bearer(tenant));

  /** What the engine's `begin` and commits leave: the run's row, then a row per step begun. */
  const runRow = (
    runId: string,
    status: 'running' | 'done' | 'failed',
    extra: { tenant?: string; output?: unknown; error?: string; workflow?: string; steps?: string[] } = {},
  ) =>
    db.query(
      `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, output, error, finished_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $4 = 'running' THEN NULL ELSE now() END)`,
      [
        runId,
        extra.workflow ?? 'triage',
        extra.tenant ?? TENANT_A.tenant,
        status,
        extra.steps ?? STEPS,
        extra.output === undefined ? null : JSON.stringify(extra.output),
        extra.error ?? null,
      ],
    );
  const stepRow = (
    runId: string,
    step: string,
    status: 'running' | 'done' | 'failed',
    attempts: number,
    output?: unknown,
    error?: string,
  ) =>
    db.query(
      `INSERT INTO workflow_steps (run_id, step, status, attempts, output, error, finished_at)
       VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $3 = 'running' THEN NULL ELSE now() END)`,
      [runId, step, status, attempts, output === undefined ? null : JSON.stringify(output), error ?? null],
    );

  it('queued: a started run with only its record is queued, its steps not known yet', async () => {
    const runId = await start('/v1/triage');
    expect(await redis.exists(`{workflows}:job:${runId}`)).toBe(1);
    expect((await get(runId).expect(200)).body).toEqual({
      run_id: runId,
      workflow: 'triage',
      status: 'queued',
      steps: [],
    });
  });

  it('running: the steps in the order the row names them, pending until a step has a row', async () => {
    const runId = await start('/v1/triage');
    await runRow(runId, 'running');
    await stepRow(runId, 'classify', 'done', 1, { category: 'billing' });
    await stepRow(runId, 'draft', 'running', 2);
    expect((await get(runId).expect(200)).body).toEqual({
      run_id: runId,
      workflow: 'triage',
      status: 'running',
      steps: [
        { name: 'classify', status: 'done', attempts: 1, output: { category: 'billing' } },
        { name: 'draft', status: 'running', attempts: 2 },
        { name: 'notify', status: 'pending', attempts: 0 },
      ],
    });
  });

  it('running with no step row yet: every step pending', async () => {
    const runId = await start('/v1/triage');
    await runRow(runId, 'running');
    const { body } = await get(runId).expect(200);
    expect(body.status).toBe('running');
    expect(body.steps).toEqual(STEPS.map((name) => ({ name, status: 'pending', attempts: 0 })));
  });

  it("done: the run's output and each step's", async () => {
    const runId = await start('/v1/triage');
    await runRow(runId, 'done', { output: { category: 'billing', draft: 'Dear customer' } });
    await stepRow(runId, 'classify', 'done', 1, { category: 'billing' });
    await stepRow(runId, 'draft', 'done', 1, { draft: 'Dear customer' });
    await stepRow(runId, 'notify', 'done', 1);
    // The record expired meanwhile (7 days): the rows alone answer.
    await redis.flushdb();
    expect((await get(runId).expect(200)).body).toEqual({
      run_id: runId,
      workflow: 'triage',
      status: 'done',
      steps: [
        { name: 'classify', status: 'done', attempts: 1, output: { category: 'billing' } },
        { name: 'draft', status: 'done', attempts: 1, output: { draft: 'Dear customer' } },
        { name: 'notify', status: 'done', attempts: 1 },
      ],
      output: { category: 'billing', draft: 'Dear customer' },
    });
  });

  it('failed: the reason, the failed step, the steps after it pending', async () => {
    const runId = await start('/v1/triage');
    await runRow(runId, 'failed', { error: 'llm_client' });
    await stepRow(runId, 'classify', 'done', 1, { category: 'billing' });
    await stepRow(runId, 'draft', 'failed', 3, undefined, 'llm_client');
    expect((await get(runId).expect(200)).body).toEqual({
      run_id: runId,
      workflow: 'triage',
      status: 'failed',
      steps: [
        { name: 'classify', status: 'done', attempts: 1, output: { category: 'billing' } },
        { name: 'draft', status: 'failed', attempts: 3 },
        { name: 'notify', status: 'pending', attempts: 0 },
      ],
      error: 'llm_client',
    });
  });

  it('failed from the record alone: dead-lettered before any row (e.g. invalid input)', async () => {
    const runId = await start('/v1/triage');
    // What the dead letter's MULTI does to the run's record.
    await redis.hset(`{workflows}:job:${runId}`, 'status', 'failed', 'error', 'invalid_input');
    expect((await get(runId).expect(200)).body).toEqual({
      run_id: runId,
      workflow: 'triage',
      status: 'failed',
      steps: [],
      error: 'invalid_input',
    });
  });

  it('failed when the dead letter marked the record but marking the row did not happen', async () => {
    const runId = await start('/v1/triage');
    await runRow(runId, 'running');
    await stepRow(runId, 'classify', 'running', 5);
    await redis.hset(`{workflows}:job:${runId}`, 'status', 'failed', 'error', 'max_deliveries');
    const { body } = await get(runId).expect(200);
    expect(body).toMatchObject({ status: 'failed', error: 'max_deliveries' });
    expect(body.steps[0]).toEqual({ name: 'classify', status: 'running', attempts: 5 });
  });

  it("404 problem for another tenant's run, in every state", async () => {
    const queued = await start('/v1/triage', TENANT_A);
    const res = await get(queued, TENANT_B).expect(404);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body.type).toBe(ProblemTypes.notFound);
    await runRow(queued, 'running');
    await get(queued, TENANT_B).expect(404);
    await db.query(`UPDATE workflow_runs SET status = 'done', output = '{"category":"x"}' WHERE run_id = $1`, [queued]);
    await get(queued, TENANT_B).expect(404);
    await get(queued, TENANT_A).expect(200);
    // A row of another tenant is the answer even where a record of the asker's would say otherwise.
    const other = randomUUID();
    await runRow(other, 'done', { tenant: TENANT_B.tenant });
    await redis.hset(`{workflows}:job:${other}`, 'tenant', TENANT_A.tenant, 'workflow', 'triage');
    await get(other, TENANT_A).expect(404);
  });

  it('404 for an unknown run id and for anything that is not one; the id in any case', async () => {
    await get(randomUUID()).expect(404);
    await get('not-a-uuid').expect(404);
    await get("1' OR '1'='1").expect(404);
    const runId = await start('/v1/triage');
    expect((await get(runId.toUpperCase()).expect(200)).body.run_id).toBe(runId);
  });

  it('401 without an API key', async () => {
    const res = await request(api.server).get(`/v1/runs/${randomUUID()}`).expect(401);
    expect(res.body.type).toBe(ProblemTypes.unauthorized);
  });

  it('a summaries job is a run: queued under its job id, workflow summaries; 404 for another tenant', async () => {
    const jobId = await start('/v1/summaries');
    expect((await get(jobId).expect(200)).body).toEqual({
      run_id: jobId,
      workflow: 'summaries',
      status: 'queued',
      steps: [],
    });
    await get(jobId, TENANT_B).expect(404);
  });

  it('a summaries job dead-lettered by the worker: failed with its reason', async () => {
    const jobId = await start('/v1/summaries');
    await redis.hset(jobRecordKey(jobId), 'status', 'failed', 'error', 'llm_client');
    expect((await get(jobId).expect(200)).body).toEqual({
      run_id: jobId,
      workflow: 'summaries',
      status: 'failed',
      steps: [],
      error: 'llm_client',
    });
  });

  it('a summaries job done before workflows existed (its summaries row only): done with {summary}', async () => {
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:key-${randomUUID()}`);
    await db.query('INSERT INTO summaries (job_id, tenant, summary) VALUES ($1, $2, $3)', [
      jobId,
      TENANT_A.tenant,
      'A fox jumped.',
    ]);
    expect((await get(jobId).expect(200)).body).toEqual({
      run_id: jobId,
      workflow: 'summaries',
      status: 'done',
      steps: [],
      output: { summary: 'A fox jumped.' },
    });
    await get(jobId, TENANT_B).expect(404);
  });

  it("the client's start on the summaries queue writes what the summaries route writes: no workflow field", async () => {
    const client = api.app.get(WorkflowClient);
    const operation = `${TENANT_A.tenant}:POST:/v1/summaries:key-${randomUUID()}`;
    const { runId, entryId } = await client.start('summaries', summaryBody, {
      tenant: TENANT_A.tenant,
      idempotency: { operation },
    });
    expect(runId).toBe(jobIdFor(operation));
    const entries = await redis.xrange(JOBS_STREAM, '-', '+');
    expect(entries).toEqual([
      [entryId, ['job_id', runId, 'tenant', TENANT_A.tenant, 'payload', JSON.stringify(summaryBody)]],
    ]);
    expect(Object.keys(await redis.hgetall(jobRecordKey(runId))).sort()).toEqual(['accepted_at', 'tenant']);
    expect((await get(runId).expect(200)).body.workflow).toBe('summaries');
  });

  it("refuses a start whose operation is not the tenant's scope, before writing anything", async () => {
    const client = api.app.get(WorkflowClient);
    // Tenant B's operation (or a bare key) would name B's run: starting it as A would hand that run to A.
    for (const operation of [
      `${TENANT_B.tenant}:POST:/v1/triage:key-1`,
      'key-1',
      `${TENANT_A.tenant}-x:POST:/v1/triage:k`,
    ])
      await expect(
        client.start('triage', triageBody, { tenant: TENANT_A.tenant, idempotency: { operation } }),
      ).rejects.toBeInstanceOf(RunTenantMismatchError);
    expect(await redis.keys('*')).toEqual([]);
  });

  it('503 problem while PostgreSQL is down, for a run Redis knows as queued too: not a guess from the record', async () => {
    const runId = await start('/v1/triage');
    const down = await testDataSource();
    await down.destroy();
    const lonely = await startApi({
      override: (b) => b.overrideProvider(WorkflowRunsReader).useValue(new WorkflowRunsReader(down)),
    });
    try {
      for (const id of [runId, randomUUID()]) {
        const res = await get(id, TENANT_A, lonely.server).expect(503);
        expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(res.body).toMatchObject({ type: ProblemTypes.serviceUnavailable, status: 503 });
        expect(res.headers['retry-after']).toBe('1');
      }
      // The api reading a live PostgreSQL answers queued from the record: the 503 was PostgreSQL's.
      expect((await get(runId).expect(200)).body.status).toBe('queued');
    } finally {
      await lonely.close();
    }
  });

  it('done from PostgreSQL while Redis is down; what only Redis knows is a 503, not a guess', async () => {
    const server = await startRedisServer(freePort(57));
    const lonely = await startApi({ env: { REDIS_URL: server.url } });
    try {
      const runId = await start('/v1/triage');
      await runRow(runId, 'done', { output: { category: 'billing', draft: 'Hi' } });
      const summarized = randomUUID();
      await db.query('INSERT INTO summaries (job_id, tenant, summary) VALUES ($1, $2, $3)', [
        summarized,
        TENANT_A.tenant,
        'Short.',
      ]);
      await server.stop();
      const done = await get(runId, TENANT_A, lonely.server).expect(200);
      expect(done.body).toMatchObject({ run_id: runId, status: 'done', output: { category: 'billing', draft: 'Hi' } });
      expect((await get(summarized, TENANT_A, lonely.server).expect(200)).body.status).toBe('done');
      // A row of another tenant is a 404 whatever Redis would say.
      await get(runId, TENANT_B, lonely.server).expect(404);
      const unknown = await get(randomUUID(), TENANT_A, lonely.server).expect(503);
      expect(unknown.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(unknown.body.type).toBe(ProblemTypes.serviceUnavailable);
      expect(unknown.headers['retry-after']).toBe('1');
    } finally {
      await lonely.close();
      await server.stop();
    }
  });
  it('documents POST /v1/triage and GET /v1/runs/{runId} in OpenAPI: tenant key, answer schemas, problems', async () => {
    type Op = {
      security?: unknown;
      parameters?: unknown[];
      responses: Record<string, { content?: Record<string, { schema?: unknown }> }>;
    };
    type Schema = { properties: Record<string, { description?: string }> };
    const doc = (await request(api.server).get('/docs/openapi.json').expect(200)).body as {
      paths: Record<string, Record<string, Op>>;
    };
    const post = doc.paths['/v1/triage'].post;
    expect(post.security).toEqual([{ 'tenant-key': [] }]);
    expect(Object.keys(post.responses)).toEqual(
      expect.arrayContaining(['202', '400', '401', '409', '413', '422', '503']),
    );
    expect(post.responses['202'].content?.['application/json']?.schema).toBeDefined();
    const read = doc.paths['/v1/runs/{runId}'].get;
    expect(read.security).toEqual([{ 'tenant-key': [] }]);
    expect(Object.keys(read.responses)).toEqual(expect.arrayContaining(['200', '401', '404', '503']));
    expect(read.responses['404'].content?.['application/problem+json']).toBeDefined();
    expect(read.responses['200'].content?.['application/json']?.schema).toBeDefined();
    expect(read.parameters).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ name: 'runId', in: 'path', schema: expect.objectContaining({ format: 'uuid' }) }),
      ]),
    );
    // text and notify: summaries' rules (one source), triage's own descriptions.
    const schemas = (doc as unknown as { components: { schemas: Record<string, Schema> } }).components.schemas;
    const triage = schemas.CreateTriageDto.properties;
    expect(Object.keys(triage)).toEqual(['ticket_id', 'text', 'notify']);
    expect(triage.text).toMatchObject({ description: "The ticket's text", minLength: 1, maxLength: 100_000 });
    expect(triage.notify).toMatchObject({ description: 'Who is told when the triage is ready', format: 'email' });
    expect(schemas.CreateSummaryDto.properties.text.description).toBe('The text to summarise');
  });
});

describe('GET /v1/runs/:runId with JOB_STREAM_PARTITIONS=4', () => {
  let api: ApiHarness;
  let redis: Redis;

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi({ env: { JOB_STREAM_PARTITIONS: '4' } });
  });
  afterAll(async () => {
    await api.close();
    redis.disconnect();
  });

  it("a start lands on its run's partition, where GET finds its record", async () => {
    const layout = new QueueLayout('workflows', 4);
    const ids: string[] = [];
    for (let i = 0; i < 8; i++) {
      const res = await request(api.server)
        .post('/v1/triage')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', `key-${randomUUID()}`)
        .send(triageBody)
        .expect(202);
      ids.push(res.body.run_id);
    }
    for (const runId of ids) {
      const partition = layout.of(runId);
      const entries = await redis.xrange(partition.jobs, '-', '+');
      expect(entries.filter(([, f]) => f[1] === runId)).toHaveLength(1);
      expect(await redis.hget(partition.jobRecordKey(runId), 'workflow')).toBe('triage');
      const res = await request(api.server).get(`/v1/runs/${runId}`).set('Authorization', bearer(TENANT_A));
      expect(res.status).toBe(200);
      expect(res.body.status).toBe('queued');
    }
    const lengths = await Promise.all(layout.partitions.map((p) => redis.xlen(p.jobs)));
    expect(lengths.reduce((a, b) => a + b, 0)).toBe(8);
    expect(await redis.exists('{workflows}:jobs')).toBe(0);
  });
});

/** A route of a workflow the api did not register: a Nest app must refuse to start, not fail at the first request. */
@Controller('v1/refund-review')
class RefundReviewController {
  constructor(@InjectWorkflow('refund_review') readonly handle: WorkflowHandle) {}
}
@Controller('v1/triage-only')
class TriageOnlyController {
  constructor(@InjectWorkflow('triage') readonly handle: WorkflowHandle) {}
}

describe('@InjectWorkflow', () => {
  it('stops an app at boot for a workflow WorkflowClientModule.forClient does not list', async () => {
    // The client's own dependencies, real and closed here (a failed compile closes nothing it made).
    const redis = await freshRedis();
    const db = await testDataSource();
    @Global()
    @Module({
      providers: [
        { provide: REDIS_CLIENT, useValue: redis },
        { provide: DataSource, useValue: db },
      ],
      exports: [REDIS_CLIENT, DataSource],
    })
    class Infra {}
    try {
      const app = (controllers: Type[]) =>
        Test.createTestingModule({
          imports: [Infra, WorkflowClientModule.forClient({ workflows: ['triage'] })],
          controllers,
        }).compile();
      await expect(app([RefundReviewController])).rejects.toThrow(/workflows:handle:refund_review/);
      // The same app with the registered workflow's handle starts.
      await (await app([TriageOnlyController])).close();
    } finally {
      await db.destroy();
      redis.disconnect();
    }
  });

  it("gives a registered workflow's handle, whose start is the client's for that workflow", async () => {
    const redis = await freshRedis();
    const api = await startApi();
    try {
      const handle = api.app.get<WorkflowHandle>('workflows:handle:triage');
      const operation = `${TENANT_A.tenant}:POST:/v1/triage:key-${randomUUID()}`;
      const { runId } = await handle.start(triageBody, { tenant: TENANT_A.tenant, idempotency: { operation } });
      expect(runId).toBe(jobIdFor(operation));
      expect((await redis.xrange('{workflows}:jobs', '-', '+')).map(([, f]) => f)).toEqual([
        ['job_id', runId, 'tenant', TENANT_A.tenant, 'payload', JSON.stringify(triageBody), 'workflow', 'triage'],
      ]);
    } finally {
      await api.close();
      redis.disconnect();
    }
  });
});
