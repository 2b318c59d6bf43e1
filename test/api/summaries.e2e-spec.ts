import { fingerprintBody, IdempotencyProblemTypes, IdempotencyStore, RedisIdempotencyStore } from '@app/idempotency';
import { JOBS_STREAM, jobIdFor, jobRecordKey } from '@app/summary-queue';
import { ProblemTypes } from '@app/problem';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { MAX_JSON_DEPTH } from '../../apps/api/src/create-api-app';
import { ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { freshRedis } from '../support/infra';
import { metricValue } from '../support/metrics';

const body = { text: 'The quick brown fox jumps over the lazy dog.', notify: 'ops@example.com' };
const newKey = () => `key-${randomUUID()}`;
const PROBLEM_JSON = /^application\/problem\+json/;

describe('POST /v1/summaries (INTERFACE.md, every row)', () => {
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
    const req = request(api.server).post('/v1/summaries').set('Authorization', bearer(tenant));
    if (key !== undefined) req.set('Idempotency-Key', key);
    return req.send(payload as object);
  };
  const streamEntries = async () =>
    (await redis.xrange(JOBS_STREAM, '-', '+')).map(([id, fields]) => ({
      id,
      fields: Object.fromEntries(
        fields.reduce<[string, string][]>((acc, v, i, a) => (i % 2 ? acc : [...acc, [v, a[i + 1]]]), []),
      ),
    }));
  const idemKeys = () => redis.keys('idem:*');

  it('new key: 202 with a job id, Location, one stream entry and the job record', async () => {
    const key = newKey();
    const res = await post(key).expect(202);
    const jobId = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    expect(res.body).toEqual({ job_id: jobId, status: 'queued' });
    expect(res.headers.location).toBe(`/v1/summaries/${jobId}`);
    expect(res.headers['idempotent-replayed']).toBeUndefined();

    const entries = await streamEntries();
    expect(entries).toHaveLength(1);
    expect(entries[0].fields).toEqual({ job_id: jobId, tenant: TENANT_A.tenant, payload: JSON.stringify(body) });
    expect(await redis.hget(jobRecordKey(jobId), 'tenant')).toBe(TENANT_A.tenant);
    expect(await redis.hget(`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`, 'state')).toBe('completed');
  });

  it('same key, same body in another key order: the stored answer again, replayed, nothing enqueued', async () => {
    const key = newKey();
    const first = await post(key).expect(202);
    const replay = await post(key, { notify: body.notify, text: body.text }).expect(202);
    expect(replay.body).toEqual(first.body);
    expect(replay.headers.location).toBe(first.headers.location);
    expect(replay.headers['content-type']).toMatch(/^application\/json/);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await streamEntries()).toHaveLength(1);
  });

  it('same key, same body, still running: 409 with Retry-After when a retry is likely to find the answer', async () => {
    // The route has answered once here: it takes milliseconds.
    const earlier = await post(newKey()).expect(202);
    const key = newKey();
    const store: IdempotencyStore = new RedisIdempotencyStore(redis);
    // Another request holds the lock: the state a slow first request leaves.
    await store.claim(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`, 'other-request', fingerprintBody(body), 12_500);
    const res = await post(key).expect(409);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(IdempotencyProblemTypes.inProgress);
    // 1 s, the least: not the 12 s until the lock would free.
    expect(Number(res.headers['retry-after'])).toBe(1);
    expect((await streamEntries()).map((e) => e.fields.job_id)).toEqual([earlier.body.job_id]);
  });

  it('same key, other body: 422 with its own problem type, nothing enqueued', async () => {
    const key = newKey();
    await post(key).expect(202);
    const res = await post(key, { ...body, text: 'Something else entirely.' }).expect(422);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body).toMatchObject({ type: IdempotencyProblemTypes.keyReused, status: 422 });
    expect(await streamEntries()).toHaveLength(1);
  });

  it('unknown fields are refused before the key is looked at; other field errors after it', async () => {
    const key = newKey();
    await post(key).expect(202);
    const record = await redis.hgetall(`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const mismatches = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'mismatch' });
    // An unknown field: 400 before any idempotency work, not the 422 of a reused key.
    const unknown = await post(key, { ...body, priority: 'high' }).expect(400);
    expect(unknown.body.errors).toEqual([{ field: 'priority', messages: ['property priority should not exist'] }]);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'mismatch' })).toBe(mismatches);
    // A known field with a bad value: the key is checked first (another body: 422).
    await post(key, { ...body, text: '' }).expect(422);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'mismatch' })).toBe(mismatches + 1);
    expect(await redis.hgetall(`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`)).toEqual(record);
    expect(await streamEntries()).toHaveLength(1);
  });

  it('key missing: 400 key-missing, nothing stored or enqueued', async () => {
    const res = await post(undefined).expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyMissing);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it.each([
    ['too short', 'abc'],
    ['too long', 'k'.repeat(129)],
    ['a space inside', 'abcdefgh ijklmnopq'],
    ['a comma inside', 'abcdefgh,ijklmnopq'],
    ['non-ASCII', 'abcdefghijklmnöpq'],
    ['an unterminated quoted form', '"abcdefghijklmnopq'],
    ['text after the closing quote', '"abcdefghijklmnopq"x'],
    ['a bad escape', '"abcdefgh\\ijklmnopq"'],
  ])('key with %s: 400 key-invalid, nothing stored or enqueued', async (_, key) => {
    const res = await post(key).expect(400);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyInvalid);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it('several Idempotency-Key headers: 400 key-invalid', async () => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      // Node sends an array as separate header lines
      .set('Idempotency-Key', ['abcdefghijklmnop1', 'abcdefghijklmnop2'] as unknown as string)
      .send(body)
      .expect(400);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyInvalid);
    expect(res.body.detail).toMatch(/exactly one/);
    expect(await streamEntries()).toHaveLength(0);
  });

  it('accepts the Structured Field string form and treats it as the bare key', async () => {
    const key = newKey();
    const quoted = await post(`"${key}"`).expect(202);
    const bare = await post(key).expect(202);
    expect(bare.headers['idempotent-replayed']).toBe('true');
    expect(bare.body).toEqual(quoted.body);
    expect(quoted.body.job_id).toBe(jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`));
    expect(await streamEntries()).toHaveLength(1);
  });

  it.each([
    ['text missing', { notify: body.notify }, 'text'],
    ['text empty', { ...body, text: '' }, 'text'],
    ['text only whitespace', { ...body, text: '   \n ' }, 'text'],
    ['text too long', { ...body, text: 'x'.repeat(100_001) }, 'text'],
    ['text not a string', { ...body, text: 42 }, 'text'],
    ['notify not an email', { ...body, notify: 'not-an-email' }, 'notify'],
    ['notify missing', { text: body.text }, 'notify'],
    ['an unknown field', { ...body, priority: 'high' }, 'priority'],
    ['text with U+0000 (PostgreSQL cannot store it)', { ...body, text: 'before\u0000after' }, 'text'],
    ['text with an unpaired surrogate', { ...body, text: 'broken \ud83d pair' }, 'text'],
    ['notify with U+0000', { ...body, notify: 'ops\u0000@example.com' }, 'notify'],
  ])('body with %s: 400 naming the field, nothing stored or enqueued', async (_, payload, field) => {
    const res = await post(newKey(), payload).expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.validationFailed);
    expect(res.body.errors.map((e: { field: string }) => e.field)).toContain(field);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it.each([
    ['U+0000', 'before\u0000after'],
    ['an unpaired surrogate', 'broken \ud83d pair'],
  ])('text with %s is refused at the door, never a job that cannot finish', async (_, text) => {
    const res = await post(newKey(), { ...body, text }).expect(400);
    expect(res.body.errors).toEqual([
      { field: 'text', messages: ['text must not contain U+0000 or unpaired UTF-16 surrogates'] },
    ]);
    expect(await streamEntries()).toHaveLength(0);
  });

  it.each([
    ['an own "__proto__" field', `{"text":"x","notify":"a@example.com","__proto__":{"admin":true}}`, '__proto__'],
    ['a "constructor" field', `{"text":"x","notify":"a@example.com","constructor":{"name":"x"}}`, 'constructor'],
    [
      '"constructor" next to another invalid field',
      `{"text":"","notify":"a@example.com","constructor":{}}`,
      'constructor',
    ],
  ])('body with %s: 400 naming it, nothing stored or enqueued', async (_, raw, field) => {
    // Sent as raw JSON: JSON.stringify would not write an own __proto__ key.
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send(raw)
      .expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.validationFailed);
    expect(res.body.errors).toContainEqual({ field, messages: [`property ${field} should not exist`] });
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  /** A valid body plus an unknown field `extra` that nests `arrays` arrays: `arrays + 1` levels in all. */
  const postNested = (arrays: number) =>
    request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send(`{"text":"x","notify":"a@example.com","extra":${'['.repeat(arrays)}${']'.repeat(arrays)}}`);

  it.each([
    ['one level over the limit', MAX_JSON_DEPTH],
    ['2,000 levels (8 KB)', 2_000],
    ['100,000 levels', 100_000],
  ])('a body nested %s deep: 400 json-too-deep, nothing stored or enqueued', async (_, arrays) => {
    const res = await postNested(arrays).expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.jsonTooDeep);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
    // At the limit itself the body gets through to validation, which names the unknown field.
    const atLimit = await postNested(MAX_JSON_DEPTH - 1).expect(400);
    expect(atLimit.body.type).toBe(ProblemTypes.validationFailed);
    expect(atLimit.body.errors.map((e: { field: string }) => e.field)).toEqual(['extra']);
  });

  it('the path as typed does not matter: /V1/Summaries/ and /v1/summaries with one key are one job', async () => {
    const key = newKey();
    const canonical = jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);
    const post = (path: string) =>
      request(api.server).post(path).set('Authorization', bearer(TENANT_A)).set('Idempotency-Key', key).send(body);
    // Express routes all of these to the one handler; the first names the canonical job.
    const first = await post('/V1/Summaries/').expect(202);
    expect(first.body.job_id).toBe(canonical);
    expect(first.headers.location).toBe(`/v1/summaries/${canonical}`);
    for (const path of ['/v1/summaries', '/V1/SUMMARIES', '/v1/summaries/']) {
      const again = await post(path).expect(202);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body.job_id).toBe(canonical);
    }
    const entries = await streamEntries();
    expect(entries).toHaveLength(1);
    expect(entries[0].fields.job_id).toBe(canonical);
    expect(await idemKeys()).toEqual([`idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`]);
  });

  it('accepts text of exactly 100000 characters', async () => {
    await post(newKey(), { ...body, text: 'y'.repeat(100_000) }).expect(202);
    expect(await streamEntries()).toHaveLength(1);
  });

  it('a corrected retry with the key of an invalid request runs for real', async () => {
    const key = newKey();
    await post(key, { ...body, notify: 'nope' }).expect(400);
    const res = await post(key).expect(202);
    expect(res.headers['idempotent-replayed']).toBeUndefined();
    expect(await streamEntries()).toHaveLength(1);
  });

  it.each([
    ['an array', [body]],
    ['a string', '"text"'],
  ])('a JSON body that is %s: 400, nothing stored', async (_, payload) => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send(typeof payload === 'string' ? payload : JSON.stringify(payload))
      .expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it('malformed JSON: 400 malformed-json, nothing stored', async () => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send('{"text": "unterminated')
      .expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.malformedJson);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it('a body that is not JSON: 400, nothing stored', async () => {
    const res = await request(api.server)
      .post('/v1/summaries')
      .set('Authorization', bearer(TENANT_A))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'text/plain')
      .send('summarise this please')
      .expect(400);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it('body over 1 MiB: 413 problem+json, nothing stored or enqueued', async () => {
    const res = await post(newKey(), { ...body, text: 'z'.repeat(1024 * 1024 + 10) }).expect(413);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.payloadTooLarge);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it.each([
    ['no Authorization header', undefined],
    ['an unknown key', 'Bearer not-a-real-key-at-all'],
    ['another scheme', `Basic ${TENANT_A.key}`],
    ['an empty bearer', 'Bearer '],
  ])('%s: 401 problem+json, nothing stored or enqueued', async (_, authorization) => {
    const req = request(api.server).post('/v1/summaries').set('Idempotency-Key', newKey());
    if (authorization !== undefined) req.set('Authorization', authorization);
    const res = await req.send(body).expect(401);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.headers['www-authenticate']).toBe('Bearer');
    expect(res.body.type).toBe(ProblemTypes.unauthorized);
    expect(await streamEntries()).toHaveLength(0);
    expect(await idemKeys()).toEqual([]);
  });

  it("keeps tenants apart: tenant B's equal key is a new job, never tenant A's replay", async () => {
    const key = newKey();
    const a = await post(key, body, TENANT_A).expect(202);
    const b = await post(key, body, TENANT_B).expect(202);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(b.body.job_id).not.toBe(a.body.job_id);
    expect(b.body.job_id).toBe(jobIdFor(`${TENANT_B.tenant}:POST:/v1/summaries:${key}`));
    const entries = await streamEntries();
    expect(entries.map((e) => e.fields.tenant).sort()).toEqual([TENANT_A.tenant, TENANT_B.tenant]);
    // and B's other body under the same key is B's own business, not a 422 from A's record
    expect(await idemKeys()).toHaveLength(2);
  });

  it('answers 50 concurrent requests with one fresh key with one job: the rest 409 or replays of it', async () => {
    const key = newKey();
    const results = await Promise.all(Array.from({ length: 50 }, () => post(key)));
    const statuses = results.map((r) => r.status);
    expect(statuses.every((s) => s === 202 || s === 409)).toBe(true);
    const accepted = results.filter((r) => r.status === 202);
    expect(accepted.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
    expect(new Set(accepted.map((r) => r.body.job_id)).size).toBe(1);
    for (const r of results.filter((x) => x.status === 409)) {
      expect(r.body.type).toBe(IdempotencyProblemTypes.inProgress);
      expect(Number(r.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    expect(await streamEntries()).toHaveLength(1);
  });

  it('counts HTTP answers by route pattern and status', async () => {
    const labels = { method: 'POST', route: '/v1/summaries', status: '202' };
    const before = await metricValue(api.server, 'http_request_duration_seconds_count', labels);
    await post(newKey()).expect(202);
    await request(api.server).get('/v1/nothing-here').expect(404);
    expect(await metricValue(api.server, 'http_request_duration_seconds_count', labels)).toBe(before + 1);
    expect(
      await metricValue(api.server, 'http_request_duration_seconds_count', {
        method: 'GET',
        route: 'unmatched',
        status: '404',
      }),
    ).toBeGreaterThanOrEqual(1);
  });

  it('unknown routes and methods answer problem+json', async () => {
    const res = await request(api.server).get('/v1/nothing-here').expect(404);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(ProblemTypes.notFound);
  });
});
