import { DEAD_LETTER_STREAM, JOBS_STREAM, SUMMARY_READY_TOPIC } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freePort, freshRedis, startRedisServer, testDataSource, truncateAll } from '../support/infra';
import { adminCli } from '../support/admin-cli';
import { metricValue } from '../support/metrics';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

const ADMIN = { key: 'admin-key-0123456789abcdefghij' };

// Ids that cannot exist: above Redis's 2^64−1 a stream id part, above bigint's 2^63−1 or 0 a row id, or malformed.
const BAD_DEAD_LETTER_IDS = [
  '18446744073709551616-0',
  '0-18446744073709551616',
  '99999999999999999999-0',
  'not-an-id',
  '1-2-3',
  '1764460800000',
];
const BAD_ROW_IDS = ['9223372036854775808', '9999999999999999999', '0', 'not-an-id', '1-2-3'];
const LAST_DEAD_LETTER_ID = '18446744073709551615-18446744073709551615';
const LAST_ROW_ID = '9223372036854775807';

describe('operating the dead letters and the outbox', () => {
  let api: ApiHarness;
  let worker: WorkerHarness;
  let model: FakeOpenAiServer;
  let redis: Redis;
  let db: DataSource;

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
    api = await startApi({ env: { ADMIN_API_KEY: ADMIN.key } });
    worker = await startWorker({ modelUrl: model.baseUrl });
  });
  afterAll(async () => {
    await worker.close();
    await api.close();
    await model.stop();
    await db.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    model.requests.length = 0;
    model.reply = () => ({ kind: 'complete', content: 'Summarised.' });
  });
  afterEach(() => redis.disconnect());

  const admin = (method: 'get' | 'post', path: string, key: { key: string } = ADMIN) =>
    request(api.server)[method](path).set('Authorization', bearer(key));
  const submit = async () =>
    (
      await request(api.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', `key-${randomUUID()}`)
        .send({ text: 'Please summarise this.', notify: 'ops@example.com' })
        .expect(202)
    ).body.job_id as string;
  const status = async (jobId: string) =>
    (await request(api.server).get(`/v1/summaries/${jobId}`).set('Authorization', bearer(TENANT_A)).expect(200)).body;
  const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`))[0].n);

  it.each([
    ['tenant A’s key', TENANT_A],
    ['tenant B’s key', TENANT_B],
    ['an unknown key', { key: 'not-the-admin-key-at-all' }],
  ])('rejects %s with 401', async (_, key) => {
    for (const [method, path] of [
      ['get', '/admin/stats'],
      ['get', '/admin/dead-letters'],
      ['post', '/admin/dead-letters/redrive'],
      ['get', '/admin/outbox/parked'],
      ['post', '/admin/outbox/requeue'],
    ] as const) {
      const res = await admin(method, path, key).expect(401);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    }
    await request(api.server).get('/admin/stats').expect(401);
  });

  it('a re-drive of a dead-lettered job completes it exactly once', async () => {
    model.reply = () => ({ kind: 'error', status: 400 });
    const jobId = await submit();
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['dead_lettered']);
    expect(await status(jobId)).toMatchObject({ status: 'failed', error: 'llm_client' });

    const listed = (await admin('get', '/admin/dead-letters').expect(200)).body.dead_letters;
    expect(listed).toEqual([expect.objectContaining({ jobId, tenant: TENANT_A.tenant, reason: 'llm_client' })]);
    const before = await metricValue(api.server, 'admin_actions_total', { action: 'redrive' });

    model.reply = () => ({ kind: 'complete', content: 'Second time lucky.' });
    const redriven = (await admin('post', `/admin/dead-letters/${listed[0].id}/redrive`).expect(200)).body;
    expect(redriven).toMatchObject({ dead_letter: listed[0].id, job_id: jobId });
    expect(await status(jobId)).toEqual({ job_id: jobId, status: 'queued' });
    expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(0);
    // A second re-drive of the same entry finds nothing: it ran once.
    await admin('post', `/admin/dead-letters/${listed[0].id}/redrive`).expect(404);
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(before + 1);

    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    expect(await status(jobId)).toEqual({ job_id: jobId, status: 'done', summary: 'Second time lucky.' });
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
    expect(model.calls).toBe(2);
  });

  it('a re-drive of a job that finished meanwhile stays harmless', async () => {
    const jobId = await submit();
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['done']);
    // Dead-lettered although its summary exists (a crash after the commit, then a bad retry).
    const [entry] = await redis.xrange(DEAD_LETTER_STREAM, '-', '+');
    expect(entry).toBeUndefined();
    await redis.xadd(
      DEAD_LETTER_STREAM,
      '*',
      'job_id',
      jobId,
      'tenant',
      TENANT_A.tenant,
      'payload',
      '{"text":"x","notify":"a@b.co"}',
      'reason',
      'max_deliveries',
      'source_id',
      '1-0',
    );
    const { redriven } = (await admin('post', '/admin/dead-letters/redrive').expect(200)).body;
    expect(redriven).toBe(1);
    expect((await worker.consumer.runOnce()).map((r) => r.outcome)).toEqual(['duplicate']);
    expect(await count('outbox')).toBe(1);
    expect(model.calls).toBe(1);
  });

  it('a dead letter recorded by id only cannot be re-driven: 409, and it stays', async () => {
    const id = await redis.xadd(DEAD_LETTER_STREAM, '*', 'reason', 'deleted_from_stream', 'source_id', '5-0');
    const res = await admin('post', `/admin/dead-letters/${id}/redrive`).expect(409);
    expect(res.body.detail).toContain('deleted_from_stream');
    expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(1);
    await admin('post', '/admin/dead-letters/123-0/redrive').expect(404);
    await admin('post', '/admin/dead-letters/not-an-id/redrive').expect(400);
  });

  it('lists parked outbox rows and re-queues them: fresh attempts, due now', async () => {
    await db.query(
      `INSERT INTO outbox (topic, dedupe_key, payload, attempts, last_error, parked_at)
       VALUES ($1, 'summary_ready:a', '{}', 10, 'HTTP 503', now()),
              ($1, 'summary_ready:b', '{}', 10, 'HTTP 503', now()),
              ($1, 'summary_ready:c', '{}', 0, NULL, NULL)`,
      [SUMMARY_READY_TOPIC],
    );
    const parked = (await admin('get', '/admin/outbox/parked').expect(200)).body.parked;
    expect(parked.map((p: { dedupeKey: string }) => p.dedupeKey)).toEqual(['summary_ready:a', 'summary_ready:b']);
    expect(parked[0]).toMatchObject({ attempts: 10, lastError: 'HTTP 503' });
    expect((await admin('get', '/admin/stats').expect(200)).body.outbox).toMatchObject({ backlog: 1, parked: 2 });

    expect((await admin('post', `/admin/outbox/${parked[0].id}/requeue`).expect(200)).body).toEqual({
      requeued: [parked[0].id],
    });
    await admin('post', `/admin/outbox/${parked[0].id}/requeue`).expect(404);
    expect((await admin('post', '/admin/outbox/requeue').expect(200)).body).toEqual({ requeued: [parked[1].id] });
    const rows = await db.query(
      `SELECT dedupe_key, attempts, parked_at, last_error, next_attempt_at <= now() AS due FROM outbox ORDER BY id`,
    );
    expect(rows).toEqual([
      { dedupe_key: 'summary_ready:a', attempts: 0, parked_at: null, last_error: null, due: true },
      { dedupe_key: 'summary_ready:b', attempts: 0, parked_at: null, last_error: null, due: true },
      { dedupe_key: 'summary_ready:c', attempts: 0, parked_at: null, last_error: null, due: true },
    ]);
    // Counted in Redis for the whole system (this test's Redis database started empty).
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'requeue' })).toBe(2);
  });

  it('re-drives in bounded calls: ?limit= dead letters looked at, next to go on, each re-drive counted', async () => {
    const letter = (jobId: string) =>
      redis.xadd(
        DEAD_LETTER_STREAM,
        '*',
        'job_id',
        jobId,
        'tenant',
        TENANT_A.tenant,
        'payload',
        '{"text":"x","notify":"a@b.co"}',
        'reason',
        'llm_client',
        'source_id',
        '1-0',
      );
    await letter(randomUUID());
    const b = await redis.xadd(DEAD_LETTER_STREAM, '*', 'reason', 'deleted_from_stream', 'source_id', '5-0');
    await letter(randomUUID());
    await letter(randomUUID());

    const first = (await admin('post', '/admin/dead-letters/redrive?limit=2').expect(200)).body;
    expect(first).toEqual({ redriven: 1, notRedrivable: [b], next: b });
    expect(await redis.xlen(JOBS_STREAM)).toBe(1);
    const second = (await admin('post', `/admin/dead-letters/redrive?limit=2&after=${first.next}`).expect(200)).body;
    expect(second).toEqual({ redriven: 2, notRedrivable: [] });
    expect(await redis.xlen(JOBS_STREAM)).toBe(3);
    expect((await redis.xrange(DEAD_LETTER_STREAM, '-', '+')).map(([id]) => id)).toEqual([b]);
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(3);
  });

  it.each([
    ['/admin/dead-letters?after=not-an-id', 'get', 'after'],
    ['/admin/dead-letters?count=0', 'get', 'count'],
    ['/admin/dead-letters?count=12abc', 'get', 'count'],
    ['/admin/outbox/parked?count=501', 'get', 'count'],
    ['/admin/dead-letters/redrive?limit=-1', 'post', 'limit'],
    ['/admin/dead-letters/redrive?after=1-0-0', 'post', 'after'],
  ] as const)('answers %s with a 400 naming the parameter, and changes nothing', async (path, method, field) => {
    await redis.xadd(
      DEAD_LETTER_STREAM,
      '*',
      'job_id',
      randomUUID(),
      'tenant',
      TENANT_A.tenant,
      'payload',
      '{"text":"x","notify":"a@b.co"}',
      'reason',
      'llm_client',
      'source_id',
      '1-0',
    );
    const res = await admin(method, path).expect(400);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body).toMatchObject({
      type: 'urn:llm-workflows:problem:validation-failed',
      errors: [expect.objectContaining({ field })],
    });
    expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(1);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
  });

  /** A dead letter that can be re-driven and a parked row that can be re-queued, to see that nothing moved. */
  const standing = async () => {
    await redis.xadd(
      DEAD_LETTER_STREAM,
      '*',
      'job_id',
      randomUUID(),
      'tenant',
      TENANT_A.tenant,
      'payload',
      '{"text":"x","notify":"a@b.co"}',
      'reason',
      'llm_client',
      'source_id',
      '1-0',
    );
    await db.query(
      `INSERT INTO outbox (topic, dedupe_key, payload, attempts, last_error, parked_at) VALUES ($1, 'summary_ready:a', '{}', 10, 'HTTP 503', now())`,
      [SUMMARY_READY_TOPIC],
    );
  };
  const unchanged = async () => {
    expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(1);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
    expect(await db.query(`SELECT attempts, parked_at IS NOT NULL AS parked FROM outbox`)).toEqual([
      { attempts: 10, parked: true },
    ]);
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(0);
    expect(await metricValue(api.server, 'admin_actions_total', { action: 'requeue' })).toBe(0);
  };

  it.each([
    ...BAD_DEAD_LETTER_IDS.flatMap((id) => [
      ['post', `/admin/dead-letters/${id}/redrive`, 'id'],
      ['get', `/admin/dead-letters?after=${id}`, 'after'],
      ['post', `/admin/dead-letters/redrive?after=${id}`, 'after'],
    ]),
    ...BAD_ROW_IDS.map((id) => ['post', `/admin/outbox/${id}/requeue`, 'id']),
  ] as ['get' | 'post', string, string][])(
    'answers %s %s, an id that cannot exist, with a 400 naming %s (not a 503 from the store), and changes nothing',
    async (method, path, field) => {
      await standing();
      const res = await admin(method, path).expect(400);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body).toMatchObject({
        type: 'urn:llm-workflows:problem:validation-failed',
        status: 400,
        errors: [{ field, messages: [expect.stringMatching(/^must be an? /)] }],
      });
      await unchanged();
    },
  );

  it('takes the largest ids as ids that could exist: none there, so 404 (one) or nothing (after it)', async () => {
    await standing();
    for (const path of [`/admin/dead-letters/${LAST_DEAD_LETTER_ID}/redrive`, `/admin/outbox/${LAST_ROW_ID}/requeue`]) {
      const res = await admin('post', path);
      expect({ path, status: res.status, type: res.body.type }).toEqual({
        path,
        status: 404,
        type: 'urn:llm-workflows:problem:not-found',
      });
    }
    // Redis refuses a range that starts after the largest id; the api knows there is nothing there.
    expect((await admin('get', `/admin/dead-letters?after=${LAST_DEAD_LETTER_ID}`).expect(200)).body).toEqual({
      dead_letters: [],
    });
    expect((await admin('post', `/admin/dead-letters/redrive?after=${LAST_DEAD_LETTER_ID}`).expect(200)).body).toEqual({
      redriven: 0,
      notRedrivable: [],
    });
    await unchanged();
  });

  it('answers 503 (problem+json, Retry-After), not 500, when Redis does not answer', async () => {
    const server = await startRedisServer(freePort(3));
    const lonely = await startApi({ env: { ADMIN_API_KEY: ADMIN.key, REDIS_URL: server.url } });
    try {
      await request(lonely.server).get('/admin/stats').set('Authorization', bearer(ADMIN)).expect(200);
      await server.stop();
      for (const [method, path] of [
        ['get', '/admin/stats'],
        ['get', '/admin/dead-letters'],
        ['post', '/admin/dead-letters/redrive'],
        ['post', '/admin/dead-letters/1-0/redrive'],
      ] as const) {
        const res = await request(lonely.server)[method](path).set('Authorization', bearer(ADMIN));
        expect({ path, status: res.status, type: res.body.type, retryAfter: res.headers['retry-after'] }).toEqual({
          path,
          status: 503,
          type: 'urn:llm-workflows:problem:service-unavailable',
          retryAfter: '1',
        });
      }
    } finally {
      await lonely.close();
      await server.stop();
    }
  });

  it('documents the admin endpoints in /docs: their own key, optional paging, answer schemas, problem answers', async () => {
    type Op = {
      parameters?: { name: string; in: string; required?: boolean }[];
      responses: Record<string, { content?: Record<string, { schema?: unknown }> }>;
      security?: Record<string, string[]>[];
    };
    const doc = (await request(api.server).get('/docs/openapi.json').expect(200)).body as {
      paths: Record<string, Record<string, Op>>;
      components: { securitySchemes: Record<string, unknown> };
    };
    expect(Object.keys(doc.components.securitySchemes).sort()).toEqual(['admin-key', 'tenant-key']);
    const adminOps = Object.entries(doc.paths).filter(([path]) => path.startsWith('/admin/'));
    expect(adminOps.length).toBeGreaterThanOrEqual(7);
    for (const [path, ops] of adminOps) {
      for (const [method, op] of Object.entries(ops)) {
        const where = `${method.toUpperCase()} ${path}`;
        expect({ where, security: op.security }).toEqual({ where, security: [{ 'admin-key': [] }] });
        expect({ where, ok: Boolean(op.responses['200']?.content?.['application/json']?.schema) }).toEqual({
          where,
          ok: true,
        });
        expect({ where, unauthorized: Boolean(op.responses['401']?.content?.['application/problem+json']) }).toEqual({
          where,
          unauthorized: true,
        });
        for (const p of op.parameters ?? []) {
          if (p.in === 'query')
            expect({ where, query: p.name, required: p.required ?? false }).toEqual({
              where,
              query: p.name,
              required: false,
            });
        }
      }
    }
    expect(doc.paths['/v1/summaries'].post.security).toEqual([{ 'tenant-key': [] }]);
    expect(Object.keys(doc.paths['/v1/summaries'].post.responses)).toEqual(
      expect.arrayContaining(['202', '400', '401', '409', '413', '422', '503']),
    );
  });

  it('shows the queue figures', async () => {
    await submit();
    await submit();
    await redis.xadd(DEAD_LETTER_STREAM, '*', 'reason', 'deleted_from_stream', 'source_id', '5-0');
    expect((await admin('get', '/admin/stats').expect(200)).body.queue).toEqual({
      length: 2,
      pending: 0,
      deadLetters: 1,
      partitions: [{ partition: 0, length: 2, pending: 0, deadLetters: 1 }],
    });
  });

  describe('the admin CLI (built by the test setup, as in the image)', () => {
    const cli = adminCli();

    it('lists and re-drives dead letters, logging each re-drive to stderr', async () => {
      model.reply = () => ({ kind: 'error', status: 400 });
      const jobId = await submit();
      await worker.consumer.runOnce();
      const list = cli('dead-letters', 'list');
      expect(list.code).toBe(0);
      const [letter] = JSON.parse(list.out).dead_letters;
      expect(letter).toMatchObject({ jobId, reason: 'llm_client' });
      const redrive = cli('dead-letters', 'redrive', letter.id);
      expect(redrive.code).toBe(0);
      expect(JSON.parse(redrive.out)).toMatchObject({ outcome: 'redriven', jobId });
      expect(redrive.err).toContain('"msg":"dead letter re-driven"');
      expect(await redis.xlen(JOBS_STREAM)).toBe(1);
      expect(cli('dead-letters', 'redrive', letter.id).code).toBe(1);
      // The CLI exits at once and nothing scrapes it: its re-drive counts on the api's /metrics.
      expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(1);
    });

    it('re-drives every dead letter with --all, past the API’s per-call limit, logging each one', async () => {
      const n = 1005;
      const pipeline = redis.pipeline();
      for (let i = 0; i < n; i++) {
        pipeline.xadd(
          DEAD_LETTER_STREAM,
          '*',
          'job_id',
          randomUUID(),
          'tenant',
          TENANT_A.tenant,
          'payload',
          '{"text":"x","notify":"a@b.co"}',
          'reason',
          'llm_client',
          'source_id',
          '1-0',
        );
      }
      await pipeline.exec();
      const all = cli('dead-letters', 'redrive', '--all');
      expect(all.code).toBe(0);
      expect(JSON.parse(all.out)).toEqual({ redriven: n, notRedrivable: [] });
      expect(all.err.split('\n').filter((l) => l.includes('"msg":"dead letter re-driven"'))).toHaveLength(n);
      expect(await redis.xlen(JOBS_STREAM)).toBe(n);
      expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(0);
      expect(await metricValue(api.server, 'admin_actions_total', { action: 'redrive' })).toBe(n);
    });

    it('re-queues parked rows and shows the figures', async () => {
      await db.query(
        `INSERT INTO outbox (topic, dedupe_key, payload, attempts, parked_at) VALUES ('t', 'k1', '{}', 10, now())`,
      );
      expect(JSON.parse(cli('stats').out).outbox.parked).toBe(1);
      const requeue = cli('outbox', 'requeue', '--all');
      expect(requeue.code).toBe(0);
      expect(JSON.parse(requeue.out).requeued).toHaveLength(1);
      expect(requeue.err).toContain('"msg":"parked outbox row re-queued"');
      expect(JSON.parse(cli('stats').out).outbox).toMatchObject({ parked: 0, backlog: 1 });
      expect(await metricValue(api.server, 'admin_actions_total', { action: 'requeue' })).toBe(1);
    });

    it('answers an id that cannot exist with a usage error naming the argument, exit code 2, and changes nothing', async () => {
      await standing();
      for (const [args, named] of [
        [['dead-letters', 'redrive', '18446744073709551616-0'], 'ID'],
        [['dead-letters', 'redrive', '1-2-3'], 'ID'],
        [['dead-letters', 'list', '--after', '0-18446744073709551616'], '--after'],
        [['dead-letters', 'list', '--after', 'not-an-id'], '--after'],
        [['outbox', 'requeue', '9223372036854775808'], 'ID'],
        [['outbox', 'requeue', '0'], 'ID'],
      ] as const) {
        const r = cli(...args);
        expect({ args, code: r.code, err: r.err.split('\n')[0] }).toEqual({
          args,
          code: 2,
          err: expect.stringMatching(new RegExp(`^admin: ${named} must be an? `)),
        });
        expect(r.err).toContain('usage: admin');
      }
      await unchanged();
    });

    it('takes the largest ids: not found (exit code 1), or nothing after it', async () => {
      await standing();
      const redrive = cli('dead-letters', 'redrive', LAST_DEAD_LETTER_ID);
      expect({ code: redrive.code, out: JSON.parse(redrive.out) }).toEqual({ code: 1, out: { outcome: 'not_found' } });
      const requeue = cli('outbox', 'requeue', LAST_ROW_ID);
      expect({ code: requeue.code, out: JSON.parse(requeue.out) }).toEqual({ code: 1, out: { requeued: [] } });
      const list = cli('dead-letters', 'list', '--after', LAST_DEAD_LETTER_ID);
      expect({ code: list.code, out: JSON.parse(list.out) }).toEqual({ code: 0, out: { dead_letters: [] } });
      await unchanged();
    });

    it('answers a usage error with exit code 2 and the usage', () => {
      const r = cli('dead-letters', 'explode');
      expect(r.code).toBe(2);
      expect(r.err).toContain('usage: admin');
    });

    it('migrate applies nothing twice', () => {
      const r = cli('migrate');
      expect(r.code).toBe(0);
      expect(JSON.parse(r.out)).toEqual({ applied: [] });
    });
  });
});
