import { fingerprintBody, IdempotencyProblemTypes, IdempotencyStore, RedisIdempotencyStore } from '@app/idempotency';
import { ProblemTypes } from '@app/problem';
import { type Durability, REDIS_CLIENT, type RedisClient } from '@app/redis';
import { jobIdFor } from '@app/summary-queue';
import { ClientQueues, WorkflowClient } from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { freePort, freshRedis, startRedisServer } from '../support/infra';

/*
 * POST /v1/triage answers as POST /v1/summaries does (INTERFACE.md,
 * "Workflows"): every row of the idempotency table, with the effect asserted
 * where it lands: one step entry on the shared queue `{workflows}:jobs` (and
 * the run's record) per new key, none for anything refused.
 */
const STREAM = '{workflows}:jobs';
const recordKey = (runId: string) => `{workflows}:job:${runId}`;
const body = { ticket_id: 'T-1042', text: 'My order arrived broken; I want a replacement.', notify: 'ops@example.com' };
const newKey = () => `key-${randomUUID()}`;
const operation = (key: string, tenant: { tenant: string } = TENANT_A) => `${tenant.tenant}:POST:/v1/triage:${key}`;
const PROBLEM_JSON = /^application\/problem\+json/;

describe('POST /v1/triage (INTERFACE.md, every row of the idempotency table)', () => {
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

  it('same key, same body in another key order: the stored answer again, replayed, nothing started', async () => {
    const key = newKey();
    const first = await post(key).expect(202);
    const record = await redis.hgetall(recordKey(first.body.run_id));
    const replay = await post(key, { notify: body.notify, text: body.text, ticket_id: body.ticket_id }).expect(202);
    expect(replay.body).toEqual(first.body);
    expect(replay.headers.location).toBe(first.headers.location);
    expect(replay.headers['content-type']).toMatch(/^application\/json/);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await streamEntries()).toHaveLength(1);
    expect(await redis.hgetall(recordKey(first.body.run_id))).toEqual(record);
  });

  it('same key, same body, still running: 409 with Retry-After, nothing started', async () => {
    const earlier = await post(newKey()).expect(202);
    const key = newKey();
    const store: IdempotencyStore = new RedisIdempotencyStore(redis);
    // Another request holds the lock: the state a slow first request leaves.
    await store.claim(operation(key), 'other-request', fingerprintBody(body), 12_500);
    const res = await post(key).expect(409);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(IdempotencyProblemTypes.inProgress);
    expect(Number(res.headers['retry-after'])).toBe(1);
    expect((await streamEntries()).map((e) => e.fields.job_id)).toEqual([earlier.body.run_id]);
    expect(await redis.exists(recordKey(jobIdFor(operation(key))))).toBe(0);
  });

  it('same key, other body: 422 with its own problem type, nothing started', async () => {
    const key = newKey();
    await post(key).expect(202);
    const res = await post(key, { ...body, ticket_id: 'T-9999' }).expect(422);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body).toMatchObject({ type: IdempotencyProblemTypes.keyReused, status: 422 });
    expect(await streamEntries()).toHaveLength(1);
  });

  it('key missing: 400 key-missing, nothing stored or started', async () => {
    const res = await post(undefined).expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyMissing);
    expect(await streamEntries()).toHaveLength(0);
    expect(await leftovers()).toEqual([]);
  });

  it.each([
    ['too short', 'abc'],
    ['too long', 'k'.repeat(129)],
    ['a space inside', 'abcdefgh ijklmnopq'],
    ['non-ASCII', 'abcdefghijklmnöpq'],
  ])('key with %s: 400 key-invalid, nothing stored or started', async (_, key) => {
    const res = await post(key).expect(400);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyInvalid);
    expect(await streamEntries()).toHaveLength(0);
    expect(await leftovers()).toEqual([]);
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

  it('a corrected retry with the key of an invalid request starts for real', async () => {
    const key = newKey();
    await post(key, { ...body, notify: 'nope' }).expect(400);
    const res = await post(key).expect(202);
    expect(res.headers['idempotent-replayed']).toBeUndefined();
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
    const api = await startApi({
      override: (b) =>
        b.overrideProvider(WorkflowClient).useFactory({
          factory: (queues: ClientQueues, r: RedisClient, ds: DataSource) =>
            new WorkflowClient(queues, r, ds, neverMet),
          inject: [ClientQueues, REDIS_CLIENT, DataSource],
        }),
    });
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

  it('the queue unreachable: 503 problem, nothing stored (records in PostgreSQL, Redis gone)', async () => {
    const server = await startRedisServer(freePort(56));
    const api = await startApi({ env: { REDIS_URL: server.url, IDEMPOTENCY_STORE: 'postgres' } });
    try {
      await server.stop();
      const res = await post(api, newKey()).expect(503);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body).toMatchObject({ type: ProblemTypes.serviceUnavailable, title: 'The run could not be queued' });
    } finally {
      await api.close();
      await server.stop();
    }
  });
});
