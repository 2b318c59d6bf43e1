import { DEAD_LETTER_STREAM, fieldsOf, JOBS_STREAM, jobRecordKey } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis, testDataSource } from '../support/infra';
import { adminCli } from '../support/admin-cli';
import { metricValue } from '../support/metrics';

const ADMIN = { key: 'admin-key-0123456789abcdefghij' };

/** The shared workflows queue with one partition (JOB_STREAM_PARTITIONS=1): what QueueLayout('workflows', 1) names. */
const WF_DEAD = '{workflows}:dead';
const WF_JOBS = '{workflows}:jobs';
const WF_ACTIONS = '{workflows}:admin_actions';
const wfRecord = (runId: string) => `{workflows}:job:${runId}`;

/** A failed step's entry as the consumer dead-letters it: the step's fields, then reason, detail, source_id. */
const stepFields = (runId: string, workflow: string, step: string, extra: string[] = []) => [
  'job_id',
  runId,
  'tenant',
  TENANT_A.tenant,
  'payload',
  '{"ticket_id":"T-1","text":"It broke.","notify":"a@b.co"}',
  'workflow',
  workflow,
  'step',
  step,
  'state',
  '{"classify":{"category":"billing"}}',
  ...extra,
];
const deadFields = ['reason', 'llm_client', 'detail', '400 Bad Request', 'source_id', '1-0'];
const summaryFields = (jobId: string) => [
  'job_id',
  jobId,
  'tenant',
  TENANT_A.tenant,
  'payload',
  '{"text":"x","notify":"a@b.co"}',
];

describe('operating the dead letters of every queue: summaries and workflows', () => {
  let api: ApiHarness;
  let redis: Redis;
  let db: DataSource;

  beforeAll(async () => {
    db = await testDataSource();
    api = await startApi({ env: { ADMIN_API_KEY: ADMIN.key } });
  });
  afterAll(async () => {
    await api.close();
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await db.query('TRUNCATE workflow_runs CASCADE');
  });
  afterEach(() => redis.disconnect());

  const admin = (method: 'get' | 'post', path: string) =>
    request(api.server)[method](path).set('Authorization', bearer(ADMIN));

  it('re-drive puts back every field of a workflow step (and an unknown one), in order, and nothing of the dead letter', async () => {
    const runId = randomUUID();
    const step = stepFields(runId, 'triage', 'draft', ['x_future', 'kept as is']);
    const streamId = await redis.xadd(WF_DEAD, '*', ...step, ...deadFields);
    await redis.hset(
      wfRecord(runId),
      'tenant',
      TENANT_A.tenant,
      'workflow',
      'triage',
      'status',
      'failed',
      'error',
      'x',
    );

    const res = (await admin('post', `/admin/dead-letters/workflows/${streamId}/redrive`).expect(200)).body;
    expect(res).toMatchObject({ dead_letter: `workflows/${streamId}`, job_id: runId, workflow: 'triage' });
    const entries = await redis.xrange(WF_JOBS, '-', '+');
    // ... and says it was re-driven (the one entry that may set its failed run running again).
    expect(entries).toEqual([[res.entry, [...step, 'redriven', '1']]]);
    expect(await redis.xlen(WF_DEAD)).toBe(0);
    expect(await redis.hgetall(wfRecord(runId))).toEqual({ tenant: TENANT_A.tenant, workflow: 'triage' });
    expect(await redis.pttl(wfRecord(runId))).toBeGreaterThan(0);
    expect(await redis.hget(WF_ACTIONS, 'redrive')).toBe('1');
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(1);
    // Nothing lands in the summaries queue.
    expect(await redis.exists(JOBS_STREAM)).toBe(0);
  });

  it('re-drive of a summaries dead letter keeps extra fields too, in its own queue', async () => {
    const jobId = randomUUID();
    const fields = [...summaryFields(jobId), 'x_future', '1'];
    const id = await redis.xadd(DEAD_LETTER_STREAM, '*', ...fields, ...deadFields);
    const res = (await admin('post', `/admin/dead-letters/${id}/redrive`).expect(200)).body;
    expect(res).toMatchObject({ dead_letter: id, job_id: jobId, workflow: 'summaries' });
    expect(await redis.xrange(JOBS_STREAM, '-', '+')).toEqual([[res.entry, [...fields, 'redriven', '1']]]);
    expect(await redis.hgetall(jobRecordKey(jobId))).toEqual({ tenant: TENANT_A.tenant });
  });

  it('a second re-drive of a step counts it: one `redriven` field, one more', async () => {
    const runId = randomUUID();
    const step = stepFields(runId, 'triage', 'draft');
    const streamId = await redis.xadd(WF_DEAD, '*', ...step, 'redriven', '1', ...deadFields);
    const res = (await admin('post', `/admin/dead-letters/workflows/${streamId}/redrive`).expect(200)).body;
    expect(await redis.xrange(WF_JOBS, '-', '+')).toEqual([[res.entry, [...step, 'redriven', '2']]]);
  });

  describe('with dead letters in both queues', () => {
    const triage1 = randomUUID();
    const triage2 = randomUUID();
    const other = randomUUID();
    const summary = randomUUID();
    // Chosen ids: the order across queues is known; a tie (7-0) goes to summaries first.
    beforeEach(async () => {
      await redis.xadd(WF_DEAD, '5-0', ...stepFields(triage1, 'triage', 'classify'), ...deadFields);
      await redis.xadd(DEAD_LETTER_STREAM, '6-0', ...summaryFields(summary), ...deadFields);
      await redis.xadd(WF_DEAD, '7-0', ...stepFields(other, 'onboarding', 'welcome'), ...deadFields);
      await redis.xadd(DEAD_LETTER_STREAM, '7-0', 'reason', 'deleted_from_stream', 'source_id', '3-0');
      await redis.xadd(WF_DEAD, '8-0', ...stepFields(triage2, 'triage', 'notify'), ...deadFields);
    });
    const ids = (letters: { id: string }[]) => letters.map((l) => l.id);
    const list = async (query = '') =>
      (await admin('get', `/admin/dead-letters${query}`).expect(200)).body.dead_letters as {
        id: string;
        workflow: string;
      }[];

    it('lists them oldest first across queues, ties by queue, with their workflow and step; the cursor pages across queues', async () => {
      const all = await list();
      expect(ids(all)).toEqual(['workflows/5-0', '6-0', '7-0', 'workflows/7-0', 'workflows/8-0']);
      expect(all[0]).toMatchObject({
        queue: 'workflows',
        partition: 0,
        workflow: 'triage',
        step: 'classify',
        jobId: triage1,
        tenant: TENANT_A.tenant,
        reason: 'llm_client',
        detail: '400 Bad Request',
        sourceId: '1-0',
      });
      expect(all[1]).toMatchObject({ queue: 'summaries', workflow: 'summaries', jobId: summary });
      expect(all[1]).not.toHaveProperty('fields');
      expect(ids(await list('?count=2&after=6-0'))).toEqual(['7-0', 'workflows/7-0']);
      expect(ids(await list('?after=workflows/7-0'))).toEqual(['workflows/8-0']);
      expect(ids(await list('?after=7-0'))).toEqual(['workflows/7-0', 'workflows/8-0']);
    });

    it('filters by workflow: a dead letter’s workflow field, or its queue’s name', async () => {
      expect(ids(await list('?workflow=triage'))).toEqual(['workflows/5-0', 'workflows/8-0']);
      expect(ids(await list('?workflow=triage&count=1'))).toEqual(['workflows/5-0']);
      expect(ids(await list('?workflow=triage&count=1&after=workflows/5-0'))).toEqual(['workflows/8-0']);
      expect(ids(await list('?workflow=summaries'))).toEqual(['6-0', '7-0']);
      expect(ids(await list('?workflow=unknown'))).toEqual([]);
    });

    it('inspects one with every field, the slash encoded or as its own path segment', async () => {
      const encoded = (await admin('get', '/admin/dead-letters/workflows%2F8-0').expect(200)).body;
      const segment = (await admin('get', '/admin/dead-letters/workflows/8-0').expect(200)).body;
      expect(segment).toEqual(encoded);
      expect(encoded).toMatchObject({
        id: 'workflows/8-0',
        queue: 'workflows',
        workflow: 'triage',
        step: 'notify',
        jobId: triage2,
        reason: 'llm_client',
        fields: fieldsOf([...stepFields(triage2, 'triage', 'notify'), ...deadFields]),
      });
      expect((await admin('get', '/admin/dead-letters/6-0').expect(200)).body).toMatchObject({
        id: '6-0',
        workflow: 'summaries',
        fields: fieldsOf([...summaryFields(summary), ...deadFields]),
      });
      await admin('get', '/admin/dead-letters/workflows/9-0').expect(404);
      const noQueue = await admin('get', '/admin/dead-letters/nope/8-0').expect(404);
      expect(noQueue.body.detail).toContain('no queue nope');
      const bad = await admin('get', '/admin/dead-letters/Nope!/8-0').expect(400);
      expect(bad.body.errors).toEqual([
        { field: 'id', messages: [expect.stringMatching(/^must be a dead-letter id <queue>/)] },
      ]);
    });

    it('re-drives all of one workflow, in bounded calls, and leaves the others', async () => {
      const first = (await admin('post', '/admin/dead-letters/redrive?workflow=triage&limit=1').expect(200)).body;
      expect(first).toEqual({ redriven: 1, notRedrivable: [], next: 'workflows/5-0' });
      const second = (
        await admin('post', `/admin/dead-letters/redrive?workflow=triage&after=${first.next}`).expect(200)
      ).body;
      expect(second).toEqual({ redriven: 1, notRedrivable: [] });
      expect((await redis.xrange(WF_JOBS, '-', '+')).map(([, f]) => fieldsOf(f).job_id)).toEqual([triage1, triage2]);
      expect(ids(await list())).toEqual(['6-0', '7-0', 'workflows/7-0']);
      expect(await redis.exists(JOBS_STREAM)).toBe(0);
    });

    it('shows every queue’s figures, and one workflow’s dead letters and failed runs', async () => {
      await db.query(
        `INSERT INTO workflow_runs (run_id, workflow, tenant, status, steps, finished_at)
         VALUES ($1, 'triage', 't', 'failed', '{classify}', now()), ($2, 'triage', 't', 'done', '{classify}', now()),
                ($3, 'onboarding', 't', 'failed', '{welcome}', now())`,
        [triage1, randomUUID(), other],
      );
      const stats = (await admin('get', '/admin/stats').expect(200)).body;
      expect(stats.queue).toEqual({
        length: 0,
        pending: 0,
        deadLetters: 2,
        partitions: [{ partition: 0, length: 0, pending: 0, deadLetters: 2 }],
      });
      expect(stats.queues).toEqual([
        { name: 'summaries', group: 'summarizers', ...stats.queue },
        {
          name: 'workflows',
          group: 'workflows',
          length: 0,
          pending: 0,
          deadLetters: 3,
          partitions: [{ partition: 0, length: 0, pending: 0, deadLetters: 3 }],
        },
      ]);
      expect(stats).not.toHaveProperty('workflow');
      const triage = (await admin('get', '/admin/stats?workflow=triage').expect(200)).body;
      expect(triage.workflow).toEqual({ name: 'triage', deadLetters: 2, failedRuns: 1 });
    });

    it.each([
      ['get', '/admin/dead-letters?workflow=bad%20name', 'workflow'],
      ['get', '/admin/stats?workflow=-x', 'workflow'],
      ['post', '/admin/dead-letters/redrive?workflow=x%21', 'workflow'],
      ['post', '/admin/dead-letters/workflows%2F1-2-3/redrive', 'id'],
      ['post', '/admin/dead-letters/workflows/1764460800000/redrive', 'id'],
      ['get', '/admin/dead-letters?after=Workflows/1-0', 'after'],
    ] as const)('answers %s %s with a 400 naming %s, and changes nothing', async (method, path, field) => {
      const res = await admin(method, path).expect(400);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body).toMatchObject({ errors: [expect.objectContaining({ field })] });
      expect(await redis.xlen(WF_DEAD)).toBe(3);
      expect(await redis.exists(WF_JOBS)).toBe(0);
    });

    it('answers a queue this system does not have with a 404 saying so, and changes nothing', async () => {
      for (const [method, path] of [
        ['post', '/admin/dead-letters/nope/5-0/redrive'],
        ['get', '/admin/dead-letters?after=nope/5-0'],
        ['post', '/admin/dead-letters/redrive?after=nope%2F5-0'],
      ] as const) {
        const res = await admin(method, path);
        expect({ path, status: res.status, detail: res.body.detail }).toEqual({
          path,
          status: 404,
          detail: expect.stringContaining('the queues are summaries, workflows'),
        });
      }
      expect(await redis.xlen(WF_DEAD)).toBe(3);
    });

    it('takes a summaries dead letter’s id with a summaries/ prefix, and answers with the id as listed', async () => {
      expect((await admin('get', '/admin/dead-letters/summaries/6-0').expect(200)).body).toMatchObject({
        id: '6-0',
        jobId: summary,
      });
      const res = (await admin('post', '/admin/dead-letters/summaries%2F6-0/redrive').expect(200)).body;
      expect(res).toMatchObject({ dead_letter: '6-0', job_id: summary, workflow: 'summaries' });
      expect(await redis.xlen(JOBS_STREAM)).toBe(1);
      expect(ids(await list())).toEqual(['workflows/5-0', '7-0', 'workflows/7-0', 'workflows/8-0']);
    });

    it('answers a queue this system does not have with a problem type of its own', async () => {
      const res = await admin('post', '/admin/dead-letters/nope/5-0/redrive').expect(404);
      expect(res.body).toMatchObject({ type: 'urn:llm-workflows:problem:no-such-queue', title: 'No such queue' });
      expect(await redis.xlen(WF_DEAD)).toBe(3);
    });

    it('pages a filtered listing with next while more may follow', async () => {
      const page = (await admin('get', '/admin/dead-letters?workflow=summaries&count=1').expect(200)).body;
      expect(page).toMatchObject({ dead_letters: [{ id: '6-0' }], next: '6-0' });
      const last = (await admin('get', '/admin/dead-letters?workflow=summaries&after=6-0').expect(200)).body;
      expect(last).toEqual({ dead_letters: [expect.objectContaining({ id: '7-0' })] });
    });

    describe('the admin CLI', () => {
      const cli = adminCli();

      it('lists, shows, counts and re-drives one workflow’s dead letters', async () => {
        const listed = cli('dead-letters', 'list', '--workflow', 'triage');
        expect(listed.code).toBe(0);
        expect(ids(JSON.parse(listed.out).dead_letters)).toEqual(['workflows/5-0', 'workflows/8-0']);

        const shown = cli('dead-letters', 'show', 'workflows/8-0');
        expect(shown.code).toBe(0);
        expect(JSON.parse(shown.out)).toMatchObject({ workflow: 'triage', step: 'notify' });
        expect(JSON.parse(shown.out).fields.state).toBe('{"classify":{"category":"billing"}}');
        expect(cli('dead-letters', 'show', 'workflows/9-0').code).toBe(1);

        expect(JSON.parse(cli('stats', '--workflow', 'triage').out).workflow).toEqual({
          name: 'triage',
          deadLetters: 2,
          failedRuns: 0,
        });

        const all = cli('dead-letters', 'redrive', '--all', '--workflow', 'triage');
        expect(all.code).toBe(0);
        expect(JSON.parse(all.out)).toEqual({ redriven: 2, notRedrivable: [] });
        expect(all.err.split('\n').filter((l) => l.includes('"workflow":"triage"'))).toHaveLength(2);
        expect(await redis.xlen(WF_JOBS)).toBe(2);
        expect(await redis.xlen(WF_DEAD)).toBe(1);

        const one = cli('dead-letters', 'redrive', 'workflows/7-0');
        expect(one.code).toBe(0);
        expect(JSON.parse(one.out)).toMatchObject({ outcome: 'redriven', jobId: other, workflow: 'onboarding' });
        expect(await redis.xlen(WF_DEAD)).toBe(0);
        expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(2);
      });

      it('refuses a malformed workflow or id with a usage error, exit code 2', async () => {
        for (const [args, named] of [
          [['dead-letters', 'list', '--workflow', 'no way'], '--workflow'],
          [['dead-letters', 'show', 'workflows/1-2-3'], 'ID'],
          [['dead-letters', 'redrive', 'workflows/5-0', '--workflow', 'triage'], '--workflow goes'],
        ] as const) {
          const r = cli(...args);
          expect({ args, code: r.code, err: r.err.split('\n')[0] }).toEqual({
            args,
            code: 2,
            err: expect.stringMatching(new RegExp(`^admin: ${named}`)),
          });
        }
        expect(await redis.xlen(WF_DEAD)).toBe(3);
      });
    });
  });
});
