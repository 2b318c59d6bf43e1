import { JOBS_STREAM, jobIdFor } from '@app/summary-queue';
import { ProblemTypes } from '@app/problem';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import { MAX_BODY_BYTES, MAX_JSON_DEPTH, MAX_JSON_MEMBERS, MAX_JSON_VALUES } from '../../apps/api/src/create-api-app';
import { TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { eventually, freePort, freshRedis, testDatabaseUrl, testRedisUrl } from '../support/infra';
import { metricValue } from '../support/metrics';

const AUTH = `Bearer ${TENANT_A.key}`;
const VALID = { text: 'A text to summarise.', notify: 'ops@example.com' };
const newKey = () => `key-${randomUUID()}`;
/** The api's own request timeout here, so a slow client is cut off within seconds. */
const REQUEST_TIMEOUT_S = 2;

/** ~90,000 unknown fields in just under 1 MiB: the body that used to hold the event loop for 14 s. */
function manyFields(): string {
  const fields = Array.from({ length: 90_000 }, (_, i) => `"f${i}":0`);
  return `{"text":"x","notify":"a@example.com",${fields.join(',')}}`;
}

interface Answer {
  readonly status: number;
  readonly headers: Headers;
  readonly text: string;
}

/**
 * The built api as a real process against a hostile client: bodies made to
 * be expensive, rejections that used to be answered before the logs and
 * metrics saw them, duplicate credentials, and a client that never finishes
 * its request. Every refusal must be cheap, small, logged with its request
 * id, counted, and leave nothing behind.
 */
describe('the api against hostile input', () => {
  let api: AppProcess;
  let redis: Redis;

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startAppProcess('api', freePort(40), {
      REDIS_URL: testRedisUrl(),
      DATABASE_URL: testDatabaseUrl(),
      API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key}`,
      LOG_LEVEL: 'info',
      HTTP_REQUEST_TIMEOUT_S: String(REQUEST_TIMEOUT_S),
    });
  }, 120_000);
  afterAll(async () => {
    api?.kill('SIGKILL');
    redis?.disconnect();
  });
  beforeEach(() => redis.flushdb());

  const post = async (body: string | Buffer, headers: Record<string, string> = {}): Promise<Answer> => {
    const res = await fetch(`${api.url}/v1/summaries`, {
      method: 'POST',
      headers: { authorization: AUTH, 'content-type': 'application/json', 'idempotency-key': newKey(), ...headers },
      body,
    });
    return { status: res.status, headers: res.headers, text: await res.text() };
  };
  const streamJobIds = async () =>
    (await redis.xrange(JOBS_STREAM, '-', '+')).map(([, f]) => f[f.indexOf('job_id') + 1]);
  const problemType = (a: Answer) => (JSON.parse(a.text) as { type: string }).type;
  const requestLine = (id: string) =>
    eventually(
      () => api.lines.find((l) => (l.req as { id?: string } | undefined)?.id === id && 'res' in l),
      5000,
      `the log line of request ${id}`,
    );

  it('90,000 unknown fields, plain or brotli: a small 400 while valid requests go on being served, and nothing is left behind', async () => {
    const hostile = manyFields();
    expect(hostile.length).toBeLessThan(MAX_BODY_BYTES);
    const brotli = brotliCompressSync(hostile);
    expect(brotli.length).toBeLessThan(100_000);
    const hostileKeys = [newKey(), newKey()];
    const validKeys = Array.from({ length: 20 }, newKey);
    const [plain, compressed, ...valid] = await Promise.all([
      post(hostile, { 'idempotency-key': hostileKeys[0] }),
      post(brotli, { 'idempotency-key': hostileKeys[1], 'content-encoding': 'br' }),
      ...validKeys.map((k) => post(JSON.stringify(VALID), { 'idempotency-key': k })),
    ]);
    for (const answer of [plain, compressed]) {
      expect(answer.status).toBe(400);
      expect(problemType(answer)).toBe(ProblemTypes.jsonTooManyMembers);
      expect(answer.text.length).toBeLessThan(1000);
      expect(answer.headers.get('x-request-id')).toBeTruthy();
    }
    expect(valid.map((v) => v.status)).toEqual(validKeys.map(() => 202));
    const expected = validKeys.map((k) => jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${k}`));
    expect((await streamJobIds()).sort()).toEqual(expected.sort());
    const records = await redis.keys('idem:*');
    expect(records).toHaveLength(20);
    for (const k of hostileKeys) expect(records.some((r) => r.endsWith(k))).toBe(false);
  });

  const deep = (levels: number) => `${'{"a":'.repeat(levels)}1${'}'.repeat(levels)}`;
  const cases: [string, () => [string | Buffer, Record<string, string>], number, string][] = [
    [
      'over 1 MiB',
      () => [JSON.stringify({ ...VALID, text: 'x'.repeat(MAX_BODY_BYTES) }), {}],
      413,
      ProblemTypes.payloadTooLarge,
    ],
    [
      'an unknown Content-Encoding',
      () => ['{}', { 'content-encoding': 'compress-me-not' }],
      415,
      ProblemTypes.unsupportedMediaType,
    ],
    [
      'gzip that is not gzip',
      () => [Buffer.from('not gzip at all'), { 'content-encoding': 'gzip' }],
      400,
      ProblemTypes.http(400),
    ],
    ['malformed JSON', () => ['{"text": "x",', {}], 400, ProblemTypes.malformedJson],
    ['nested too deeply', () => [deep(MAX_JSON_DEPTH + 1), {}], 400, ProblemTypes.jsonTooDeep],
    [
      'an object with too many members',
      () => [`{${Array.from({ length: MAX_JSON_MEMBERS + 1 }, (_, i) => `"m${i}":0`).join(',')}}`, {}],
      400,
      ProblemTypes.jsonTooManyMembers,
    ],
    [
      'too many values',
      () => [gzipSync(`{"text":[${Array(MAX_JSON_VALUES).fill(0).join(',')}]}`), { 'content-encoding': 'gzip' }],
      400,
      ProblemTypes.jsonTooManyValues,
    ],
    // UTF-7 spells every bracket in base64, out of a byte scan's sight: 5,000 levels here.
    [
      'in UTF-7',
      () => [
        Buffer.from(
          `+${Buffer.from(`${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}`, 'utf16le')
            .swap16()
            .toString('base64')}-`,
        ),
        { 'content-type': 'application/json; charset=utf-7' },
      ],
      415,
      ProblemTypes.unsupportedMediaType,
    ],
    [
      'in UTF-16',
      () => [Buffer.from(JSON.stringify(VALID), 'utf16le'), { 'content-type': 'application/json; charset=utf-16le' }],
      415,
      ProblemTypes.unsupportedMediaType,
    ],
  ];

  it.each(cases)(
    'a body %s: answered with its problem and request id, logged and counted, nothing stored',
    async (name, make, status, type) => {
      const id = `hostile-${name.replace(/\W+/g, '-')}-${randomUUID().slice(0, 8)}`;
      const labels = { method: 'POST', route: '/v1/summaries', status: String(status) };
      const before = await metricValue(api.url, 'http_request_duration_seconds_count', labels);
      const [body, headers] = make();
      const answer = await post(body, { ...headers, 'x-request-id': id });
      expect(answer.status).toBe(status);
      expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(problemType(answer)).toBe(type);
      expect(answer.headers.get('x-request-id')).toBe(id);
      const line = await requestLine(id);
      expect((line.res as { statusCode: number }).statusCode).toBe(status);
      expect(line.app).toBe('api');
      expect(await metricValue(api.url, 'http_request_duration_seconds_count', labels)).toBe(before + 1);
      expect(await redis.keys('idem:*')).toEqual([]);
      expect(await streamJobIds()).toEqual([]);
    },
  );

  it('a member name given twice: 400 whatever the escaping, and nothing is claimed or enqueued', async () => {
    // JSON.parse keeps the last "notify"; another reader of the same bytes may keep the first.
    for (const body of [
      '{"text":"x","notify":"ops@example.com","notify":"attacker@example.com"}',
      '{"text":"x","notify":"ops@example.com","\\u006eotify":"attacker@example.com"}',
    ]) {
      const answer = await post(body);
      expect(answer.status).toBe(400);
      expect(JSON.parse(answer.text)).toMatchObject({
        type: ProblemTypes.jsonDuplicateName,
        detail: expect.stringContaining('"notify"'),
      });
    }
    expect(await redis.keys('idem:*')).toEqual([]);
    expect(await streamJobIds()).toEqual([]);
  });

  it('two Authorization headers: 401, even when both carry a valid key, and nothing is enqueued', async () => {
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpRequest(`${api.url}/v1/summaries`, {
        method: 'POST',
        // rawHeaders form: a name may repeat (and Host is not added for us).
        headers: [
          'Host',
          new URL(api.url).host,
          'Authorization',
          AUTH,
          'Authorization',
          AUTH,
          'Content-Type',
          'application/json',
          'Idempotency-Key',
          newKey(),
        ],
      });
      req.on('response', (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      req.end(JSON.stringify(VALID));
    });
    expect(answer.status).toBe(401);
    expect(JSON.parse(answer.body)).toMatchObject({
      type: ProblemTypes.unauthorized,
      detail: 'Send one Authorization: Bearer <api key> header.',
    });
    expect(await redis.keys('idem:*')).toEqual([]);
    expect(await streamJobIds()).toEqual([]);
  });

  /**
   * Opens a socket, writes `head`, then one more piece every 200 ms until the
   * server closes it. Half-open allowed, as a hostile client would: the
   * server's FIN alone does not end it, only the server closing for good does.
   */
  const dripUntilClosed = (head: string, piece: string) =>
    new Promise<{ answer: string; drips: number }>((resolve, reject) => {
      const socket = connect({ port: Number(new URL(api.url).port), host: '127.0.0.1', allowHalfOpen: true });
      let answer = '';
      let drips = 0;
      let timer: NodeJS.Timeout | undefined;
      socket.on('connect', () => {
        socket.write(head);
        timer = setInterval(() => {
          drips++;
          socket.write(piece);
        }, 200);
      });
      socket.on('data', (d: Buffer) => (answer += d.toString()));
      socket.on('error', () => undefined); // a write after the server closed: the close below tells it
      socket.on('close', () => {
        clearInterval(timer);
        resolve({ answer, drips });
      });
      // The test's own bound: far past the server's timeout.
      setTimeout(() => reject(new Error("the server never closed the slow client's connection")), 15_000).unref();
    });

  it.each([
    ['headers that never end (slowloris)', 'POST /v1/summaries HTTP/1.1\r\nHost: api\r\n', 'X-Padding: a\r\n'],
    [
      'a body that never ends',
      `POST /v1/summaries HTTP/1.1\r\nHost: api\r\nAuthorization: ${AUTH}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{`,
      ' ',
    ],
  ])("%s: the server's own timeout cuts the client off with a 408, logged and counted once", async (_, head, piece) => {
    const refused = await metricValue(api.url, 'http_parser_refusals_total', { status: '408' });
    const answered = await metricValue(api.url, 'http_request_duration_seconds_count', {
      method: 'POST',
      route: '/v1/summaries',
      status: '400',
    });
    const accessLines = () => api.lines.filter((l) => 'res' in l).length;
    // Lines are written in batches: a request of its own, whose line is seen, marks that every line before it is in.
    const linesIn = async (): Promise<number> => {
      const marker = `marker-${randomUUID()}`;
      await fetch(`${api.url}/v1/summaries/${randomUUID()}`, {
        headers: { authorization: AUTH, 'x-request-id': marker },
      });
      await eventually(
        () => api.lines.find((l) => (l.req as { id?: string } | undefined)?.id === marker),
        5000,
        'the marker line',
      );
      return accessLines();
    };
    const linesBefore = await linesIn();
    const { answer, drips } = await dripUntilClosed(head, piece);
    // The client was still sending when the server closed (the 408's line below names the server's own timeout):
    // the server ended it. How many pieces went meanwhile depends on the machine's load, not on the server.
    expect(drips).toBeGreaterThan(0);
    expect(answer).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
    expect(answer).toMatch(/\r\nConnection: close\r\n/);
    expect(answer).toMatch(/\r\nContent-Type: application\/problem\+json\r\n/);
    const id = /\r\nX-Request-Id: ([\w-]+)\r\n/.exec(answer)?.[1];
    expect(id).toBeDefined();
    const line = await eventually(
      () => api.lines.find((l) => (l.req as { id?: string } | undefined)?.id === id),
      5000,
      'the refusal line',
    );
    expect(line).toMatchObject({
      status: 408,
      code: 'ERR_HTTP_REQUEST_TIMEOUT',
      level: 40,
      msg: 'request refused by the HTTP parser: 408 Request Timeout',
    });
    expect(await metricValue(api.url, 'http_parser_refusals_total', { status: '408' })).toBe(refused + 1);
    // The request the body belonged to ends with the socket (a 400 "could not be read", or
    // "request aborted", that nobody receives): no second line, no second observation. The server
    // destroyed that socket before the client saw it close; the metric read above and the marker
    // request below reach it on new connections after that, so its line comes after any such line.
    expect(await linesIn()).toBe(linesBefore + 1);
    expect(
      await metricValue(api.url, 'http_request_duration_seconds_count', {
        method: 'POST',
        route: '/v1/summaries',
        status: '400',
      }),
    ).toBe(answered);
    expect(await streamJobIds()).toEqual([]);
  });

  it('keeps idle connections open longer than a load balancer does (Keep-Alive: timeout=65)', async () => {
    const res = await fetch(`${api.url}/health/live`);
    expect(res.headers.get('keep-alive')).toBe('timeout=65');
  });

  it('a refused body never claims its key: the same key with a good body then runs', async () => {
    const key = newKey();
    expect((await post('{"text": "x",', { 'idempotency-key': key })).status).toBe(400);
    const good = await post(JSON.stringify(VALID), { 'idempotency-key': key });
    expect(good.status).toBe(202);
    expect(good.headers.get('idempotent-replayed')).toBeNull();
    expect(await streamJobIds()).toEqual([jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`)]);
  });
});
