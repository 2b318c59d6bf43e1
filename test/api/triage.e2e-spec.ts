import { ProblemTypes } from '@app/problem';
import type { Durability } from '@app/redis';
import { jobIdFor } from '@app/workflows';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { freePort, freshRedis, startRedisServer, testDataSource } from '../support/infra';
import { durableWorkflowClient } from '../support/workflow-client';

/*
 * POST /v1/triage (INTERFACE.md, "Workflows"), what is the route's own: the
 * entry and the record a start writes on the shared queue `{workflows}:jobs`,
 * its body's validation, its limits, tenants, and what it answers when the
 * queue cannot take the run. The idempotency table's rows (replay, 409, 422,
 * a missing or invalid key, a corrected retry) are the conformance kit's
 * (triage-conformance.e2e-spec.ts).
 */
const STREAM = '{workflows}:jobs';
const recordKey = (runId: string) => `{workflows}:job:${runId}`;
const body = { ticket_id: 'T-1042', text: 'My order arrived broken; I want a replacement.', notify: 'ops@example.com' };
const newKey = () => `key-${randomUUID()}`;
const operation = (key: string, tenant: { tenant: string } = TENANT_A) => `${tenant.tenant}:POST:/v1/triage:${key}`;
const PROBLEM_JSON = /^application\/problem\+json/;

describe('POST /v1/triage', () => {
  let api: ApiHarness;
  let redis: Redis;

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi();
  });
  afterAll(async () => {
    await api.close();
    redis.disconnect();
  });
  beforeEach(() => redis.flushdb());

  const post = (key: string | undefined, payload: unknown = body, tenant: { key: string } = TENANT_A) => {
    const req = request(api.server).post('/v1/triage').set('Authorization', bearer(tenant));
    if (key !== undefined) req.set('Idempotency-Key', key);
    return req.send(payload as object);
  };
  const streamEntries = async () =>
    (await redis.xrange(STREAM, '-', '+')).map(([id, fields]) => ({
      id,
      fields: Object.fromEntries(
        fields.reduce<[string, string][]>((acc, v, i, a) => (i % 2 ? acc : [...acc, [v, a[i + 1]]]), []),
      ),
    }));
  /** Everything the api may have written besides the entries: idempotency records and run records. */
  const leftovers = () => redis.keys('*');

  it('new key: 202 with the run id, Location, one step entry naming the workflow, and the run record', async () => {
    const key = newKey();
    const res = await post(key).expect(202);
    const runId = jobIdFor(operation(key));
    expect(res.body).toEqual({ run_id: runId, status: 'queued' });
    expect(res.headers.location).toBe(`/v1/runs/${runId}`);
    expect(res.headers['idempotent-replayed']).toBeUndefined();

    const entries = await streamEntries();
    expect(entries).toHaveLength(1);
    // The first step's entry: no `step` (the first), no `state` ({}), `workflow` since the queue is shared.
    expect(entries[0].fields).toEqual({
      job_id: runId,
      tenant: TENANT_A.tenant,
      payload: JSON.stringify(body),
      workflow: 'triage',
    });
    const record = await redis.hgetall(recordKey(runId));
    expect(record).toEqual({ tenant: TENANT_A.tenant, workflow: 'triage', accepted_at: expect.any(String) });
    expect(Number(record.accepted_at)).toBeGreaterThan(0);
    const ttl = await redis.pttl(recordKey(runId));
    expect(ttl).toBeGreaterThan(6 * 24 * 3600 * 1000);
    expect(ttl).toBeLessThanOrEqual(7 * 24 * 3600 * 1000);
    expect(await redis.hget(`idem:${operation(key)}`, 'state')).toBe('completed');
    // Nothing on the summaries queue.
    expect(await redis.exists('{summaries}:jobs')).toBe(0);
  });

  it('the payload is the validated input only, in a fixed shape, whatever order the body came in', async () => {
    const key = newKey();
    await post(key, { notify: body.notify, text: body.text, ticket_id: body.ticket_id }).expect(202);
    const [entry] = await streamEntries();
    expect(entry.fields.payload).toBe(JSON.stringify(body));
  });

  it.each([
    ['ticket_id missing', { text: body.text, notify: body.notify }, 'ticket_id'],
    ['ticket_id empty', { ...body, ticket_id: '' }, 'ticket_id'],
    ['ticket_id only whitespace', { ...body, ticket_id: '  ' }, 'ticket_id'],
    ['ticket_id over 64 characters', { ...body, ticket_id: 't'.repeat(65) }, 'ticket_id'],
    ['ticket_id not a string', { ...body, ticket_id: 1042 }, 'ticket_id'],
    ['ticket_id with U+0000', { ...body, ticket_id: 'T-\u0000' }, 'ticket_id'],
    ['text missing', { ticket_id: body.ticket_id, notify: body.notify }, 'text'],
    ['text empty', { ...body, text: '' }, 'text'],
    ['text only whitespace', { ...body, text: ' \n ' }, 'text'],
    ['text too long', { ...body, text: 'x'.repeat(100_001) }, 'text'],
    ['text not a string', { ...body, text: ['a'] }, 'text'],
    ['text with an unpaired surrogate', { ...body, text: 'broken \ud83d pair' }, 'text'],
    ['notify not an email', { ...body, notify: 'not-an-email' }, 'notify'],
    ['notify missing', { ticket_id: body.ticket_id, text: body.text }, 'notify'],
    ['an unknown field', { ...body, priority: 'high' }, 'priority'],
  ])('body with %s: 400 naming the field, nothing stored or started', async (_, payload, field) => {
    const res = await post(newKey(), payload).expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.validationFailed);
    expect(res.body.errors.map((e: { field: string }) => e.field)).toContain(field);
    expect(await streamEntries()).toHaveLength(0);
    expect(await leftovers()).toEqual([]);
  });

  it('malformed JSON: 400 malformed-json, nothing stored or started', async () => {
    const res = await request(api.server)
      .post('/v1/triage')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send('{"ticket_id": "unterminated')
      .expect(400);
    expect(res.body.type).toBe(ProblemTypes.malformedJson);
    expect(await leftovers()).toEqual([]);
  });

  it('accepts a ticket_id of 64 characters and a text of 100000', async () => {
    await post(newKey(), { ...body, ticket_id: 't'.repeat(64), text: 'y'.repeat(100_000) }).expect(202);
    expect(await streamEntries()).toHaveLength(1);
  });

  it('body over 1 MiB: 413 problem+json, nothing stored or started', async () => {
    const res = await post(newKey(), { ...body, text: 'z'.repeat(1024 * 1024 + 10) }).expect(413);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.payloadTooLarge);
    expect(await leftovers()).toEqual([]);
  });

  it.each([
    ['no Authorization header', undefined],
    ['an unknown key', 'Bearer not-a-real-key-at-all'],
    ['another scheme', `Basic ${TENANT_A.key}`],
  ])('%s: 401 problem+json, nothing stored or started', async (_, authorization) => {
    const req = request(api.server).post('/v1/triage').set('Idempotency-Key', newKey());
    if (authorization !== undefined) req.set('Authorization', authorization);
    const res = await req.send(body).expect(401);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.unauthorized);
    expect(await leftovers()).toEqual([]);
  });

  it("keeps tenants apart: tenant B's equal key is a new run, never tenant A's replay", async () => {
    const key = newKey();
    const a = await post(key, body, TENANT_A).expect(202);
    const b = await post(key, body, TENANT_B).expect(202);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(b.body.run_id).toBe(jobIdFor(operation(key, TENANT_B)));
    expect(b.body.run_id).not.toBe(a.body.run_id);
    const entries = await streamEntries();
    expect(entries.map((e) => [e.fields.job_id, e.fields.tenant])).toEqual([
      [a.body.run_id, TENANT_A.tenant],
      [b.body.run_id, TENANT_B.tenant],
    ]);
  });

  it("a run whose record is another tenant's: refused with a 500, the record as it was, nothing queued, the key freed", async () => {
    const key = newKey();
    const runId = jobIdFor(operation(key));
    // What no start of tenant A's can meet unless ids collide or a context is forged: the start must not take it over.
    await redis.hset(recordKey(runId), 'tenant', TENANT_B.tenant, 'workflow', 'triage', 'accepted_at', '1');
    const res = await post(key).expect(500);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.internal);
    expect(await redis.hgetall(recordKey(runId))).toEqual({
      tenant: TENANT_B.tenant,
      workflow: 'triage',
      accepted_at: '1',
    });
    expect(await streamEntries()).toHaveLength(0);
    expect(await redis.exists(`idem:${operation(key)}`)).toBe(0);
    // Tenant B reads its run as before; A is told nothing about it.
    expect((await request(api.server).get(`/v1/runs/${runId}`).set('Authorization', bearer(TENANT_B))).status).toBe(
      200,
    );
    await request(api.server).get(`/v1/runs/${runId}`).set('Authorization', bearer(TENANT_A)).expect(404);
  });

  it('a start that fails for another reason than the queue being down: 500, not a 503 "retry"', async () => {
    const key = newKey();
    // A key of another type where the run's record goes: Redis answers WRONGTYPE, which no retry fixes.
    await redis.set(recordKey(jobIdFor(operation(key))), 'not a hash');
    const res = await post(key).expect(500);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.internal);
    expect(res.headers['retry-after']).toBeUndefined();
    expect(await streamEntries()).toHaveLength(0);
    expect(await redis.exists(`idem:${operation(key)}`)).toBe(0);
  });

  it('answers 50 concurrent requests with one fresh key with one run: the rest 409 or replays of it', async () => {
    const key = newKey();
    const results = await Promise.all(Array.from({ length: 50 }, () => post(key)));
    expect(results.every((r) => r.status === 202 || r.status === 409)).toBe(true);
    const accepted = results.filter((r) => r.status === 202);
    expect(accepted.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
    expect(new Set(accepted.map((r) => r.body.run_id))).toEqual(new Set([jobIdFor(operation(key))]));
    expect(await streamEntries()).toHaveLength(1);
  });
});

describe('POST /v1/triage when the queue cannot take the run', () => {
  let redis: Redis;

  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  const post = (api: ApiHarness, key: string) =>
    request(api.server)
      .post('/v1/triage')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', key)
      .send(body);

  it('no replica confirms the run: 503 saying so, the key freed, a retry names the same run', async () => {
    // This Redis has no replica: a durability of one replica is never met (test/api/durable-enqueue.e2e-spec.ts).
    const neverMet: Durability = { replicas: 1, timeoutMs: 50 };
    const api = await startApi({ override: durableWorkflowClient(neverMet) });
    try {
      const key = newKey();
      const first = await post(api, key).expect(503);
      expect(first.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(first.headers['retry-after']).toBeDefined();
      expect(first.body).toMatchObject({
        type: ProblemTypes.serviceUnavailable,
        title: 'The run could not be queued durably',
      });
      expect(await redis.hgetall(`idem:${operation(key)}`)).toEqual({});
      await post(api, key).expect(503);
      // The master kept each write: two entries of one run, whose steps commit once.
      const runId = jobIdFor(operation(key));
      expect((await redis.xrange(STREAM, '-', '+')).map(([, f]) => f[1])).toEqual([runId, runId]);
    } finally {
      await api.close();
    }
  });

  it('the queue unreachable: 503 problem, nothing stored (records in PostgreSQL, Redis gone); Redis back, a fresh 202', async () => {
    const port = freePort(56);
    let server = await startRedisServer(port);
    const api = await startApi({ env: { REDIS_URL: server.url, IDEMPOTENCY_STORE: 'postgres' } });
    const db: DataSource = await testDataSource();
    const keyRow = (op: string) =>
      db.query<{ state: string }[]>('SELECT state FROM idempotency_keys WHERE key = $1', [op]);
    try {
      await server.stop();
      const key = newKey();
      const res = await post(api, key).expect(503);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body).toMatchObject({ type: ProblemTypes.serviceUnavailable, title: 'The run could not be queued' });
      // Nothing stored: the key's row in PostgreSQL was released with the 503.
      expect(await keyRow(operation(key))).toEqual([]);

      // Not events.once: it rejects on the 'error' of a reconnect attempt made before the server is back.
      const reconnected = new Promise<void>((resolve) => api.redis.once('ready', () => resolve()));
      server = await startRedisServer(port);
      await reconnected;
      const retry = await post(api, key).expect(202);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      const runId = jobIdFor(operation(key));
      expect(retry.body).toEqual({ run_id: runId, status: 'queued' });
      const again = new Redis(server.url);
      try {
        expect((await again.xrange(STREAM, '-', '+')).map(([, f]) => f[1])).toEqual([runId]);
      } finally {
        again.disconnect();
      }
      // The same query finds the row of an answered key: the empty answer above was not a wrong query.
      expect(await keyRow(operation(key))).toEqual([{ state: 'completed' }]);
    } finally {
      await db.destroy();
      await api.close();
      await server.stop();
    }
  });
});
