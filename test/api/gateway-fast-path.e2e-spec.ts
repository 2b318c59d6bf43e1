import {
  ClassSerializerInterceptor,
  type INestApplication,
  type MiddlewareConsumer,
  Module,
  type NestModule,
} from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { type IncomingMessage, request as httpRequest, type ServerResponse } from 'node:http';
import { gzipSync } from 'node:zlib';
import request from 'supertest';
import { bearer, startApi, TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { completionEvents } from '../support/fake-openai-server';
import { type GatewayHarness, startGateway } from '../support/gateway-harness';
import { eventually, freePort, testDatabaseUrl, testRedisUrl } from '../support/infra';
import { metricValue } from '../support/metrics';

/** Headers whose values differ between any two answers. */
const VOLATILE = new Set(['date', 'x-request-id', 'x-upstream-request-id', 'etag']);
const headerNames = (res: Response) => [...res.headers.keys()].filter((name) => !VOLATILE.has(name)).sort();

/**
 * The gateway's calls are served by GatewayFastPath, ahead of Express's
 * router; any other spelling of their paths (a trailing slash) still goes
 * through Express and Nest. Both must give the caller, the provider, the
 * record, the metrics and the log the same, and the first must really skip
 * the router.
 */
describe('the gateway served without Express’s router', () => {
  let gateway: GatewayHarness;
  /** Requests that reached the router's layers after the fast path's. */
  let throughRouter: string[];

  beforeAll(async () => {
    gateway = await startGateway();
    recordRouted(gateway.api.app, (seen) => throughRouter.push(seen));
  });
  afterAll(() => gateway.close());
  beforeEach(() => (throughRouter = []));

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${gateway.apiUrl}${path}`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  const routeCount = (status: string) =>
    metricValue(gateway.api.server, 'http_request_duration_seconds_count', {
      method: 'POST',
      route: '/v1/chat/completions',
      status,
    });

  it.each([
    [
      'chat completions',
      '/v1/chat/completions',
      (text: string) => ({ model: 'gpt-test', messages: [{ role: 'user', content: text }] }),
    ],
    ['responses', '/v1/responses', (text: string) => ({ model: 'gpt-test', input: text })],
  ])('answers %s alike on both paths: one upstream call each, replays from the record', async (_, path, ask) => {
    const fast = { text: `fast ${randomUUID()}`, key: randomUUID() };
    const routed = { text: `routed ${randomUUID()}`, key: randomUUID() };
    const first = await post(path, ask(fast.text), { 'idempotency-key': fast.key });
    expect(throughRouter).toEqual([]);
    const viaRouter = await post(`${path}/`, ask(routed.text), { 'idempotency-key': routed.key });
    expect(throughRouter).toEqual([`POST ${path}/`]);

    expect([first.status, viaRouter.status]).toEqual([200, 200]);
    expect(headerNames(first)).toEqual(headerNames(viaRouter));
    const [firstBody, routedBody] = [await first.text(), await viaRouter.text()];
    expect(firstBody).toContain(fast.text);
    expect(routedBody).toContain(routed.text);
    for (const { text, key, body, spelling } of [
      { ...fast, body: firstBody, spelling: path },
      { ...routed, body: routedBody, spelling: `${path}/` },
    ]) {
      expect(gateway.upstreamCalls(text)).toHaveLength(1);
      const again = await post(spelling, ask(text), { 'idempotency-key': key });
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(await again.text()).toBe(body);
      expect(gateway.upstreamCalls(text)).toHaveLength(1);
    }
  });

  it('streams alike on both paths, and replays each stream byte for byte', async () => {
    const streams = [];
    for (const path of ['/v1/chat/completions', '/v1/chat/completions/']) {
      const text = `stream ${path} ${randomUUID()}`;
      const key = randomUUID();
      gateway.replies.set(text, { kind: 'stream', events: completionEvents('streamed alike', { usage: true }) });
      const body = { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: text }] };
      const first = await post(path, body, { 'idempotency-key': key });
      const bytes = await first.text();
      const again = await post(path, body, { 'idempotency-key': key });
      expect(await again.text()).toBe(bytes);
      expect(gateway.upstreamCalls(text)).toHaveLength(1);
      streams.push({ status: first.status, type: first.headers.get('content-type'), headers: headerNames(first) });
      expect(bytes).toContain('"content":"alike"');
      expect(bytes.endsWith('data: [DONE]\n\n')).toBe(true);
    }
    expect(streams[0]).toEqual(streams[1]);
    expect(streams[0]).toMatchObject({ status: 200, type: expect.stringMatching(/^text\/event-stream/) });
    expect(throughRouter).toEqual(['POST /v1/chat/completions/', 'POST /v1/chat/completions/']);
  });

  it('takes a body over 1 MiB from a tenant only, on both paths', async () => {
    const upstreamCallsBefore = gateway.provider.requests.length;
    const large = (text: string) => ({
      model: 'gpt-test',
      messages: [
        { role: 'user', content: text },
        { role: 'user', content: 'x'.repeat(2 * 1024 * 1024) },
      ],
    });
    const answers = [];
    for (const path of ['/v1/chat/completions', '/v1/chat/completions/']) {
      const text = `large ${randomUUID()}`;
      const tenant = await post(path, large(text));
      const nobody = await fetch(`${gateway.apiUrl}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(large('nobody')),
      });
      answers.push([tenant.status, nobody.status, ((await nobody.json()) as { error: { code: string } }).error.code]);
      expect(gateway.upstreamCalls(text)).toHaveLength(1);
    }
    expect(answers).toEqual([
      [200, 413, 'payload_too_large'],
      [200, 413, 'payload_too_large'],
    ]);
    expect(gateway.provider.requests).toHaveLength(upstreamCallsBefore + 2);
  });

  it('refuses a body alike on both paths, with nothing sent upstream', async () => {
    const answers = [];
    const upstreamCallsBefore = gateway.provider.requests.length;
    for (const path of ['/v1/chat/completions', '/v1/chat/completions/']) {
      for (const body of ['{"model": "gpt-test", "messages": [', '{"model": "gpt-test", "messages": "no"}', '[]']) {
        const res = await post(path, body, { 'idempotency-key': randomUUID() });
        answers.push({ path, body, status: res.status, error: ((await res.json()) as { error: unknown }).error });
      }
    }
    expect(gateway.provider.requests).toHaveLength(upstreamCallsBefore);
    const [fast, routed] = [answers.slice(0, 3), answers.slice(3)];
    expect(fast.map(({ status, error }) => ({ status, error }))).toEqual(
      routed.map(({ status, error }) => ({ status, error })),
    );
    expect(fast.map((a) => a.status)).toEqual([400, 400, 400]);
    expect(throughRouter).toEqual(routed.map(() => 'POST /v1/chat/completions/'));
  });

  it('reads every kind of body as the body parser does, on both paths', async () => {
    // Each body sent to both spellings with the same bytes and headers: the exact path reads the common kind itself
    // (JSON in UTF-8 with a Content-Length) and leaves the rest to body-parser, the other goes through body-parser.
    const ask = (text: string, lead = '') =>
      Buffer.from(`${lead}${JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: text }] })}`);
    const cases: {
      name: string;
      body: (text: string) => Buffer;
      headers?: Record<string, string>;
      chunked?: boolean;
    }[] = [
      { name: 'plain', body: (t) => ask(t) },
      { name: 'a byte-order mark', body: (t) => Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), ask(t)]) },
      { name: 'leading whitespace', body: (t) => ask(t, ' \r\n\t') },
      {
        name: 'the type in capitals',
        body: (t) => ask(t),
        headers: { 'content-type': 'Application/JSON; Charset=UTF-8' },
      },
      { name: 'chunked', body: (t) => ask(t), chunked: true },
      { name: 'gzip', body: (t) => gzipSync(ask(t)), headers: { 'content-encoding': 'gzip' } },
      { name: 'latin1', body: (t) => ask(t), headers: { 'content-type': 'application/json; charset=latin1' } },
      { name: 'a number', body: () => Buffer.from('5') },
      { name: 'a string', body: () => Buffer.from(' "text"') },
      { name: 'empty', body: () => Buffer.alloc(0) },
      { name: 'whitespace only', body: () => Buffer.from('   ') },
      { name: 'a byte-order mark only', body: () => Buffer.from([0xef, 0xbb, 0xbf]) },
      { name: 'cut', body: (t) => ask(t).subarray(0, 30) },
      { name: 'a name twice', body: () => Buffer.from('{"model":"gpt-test","model":"other","messages":[]}') },
      { name: 'too deep', body: () => Buffer.from(`{"model":${'['.repeat(200)}${']'.repeat(200)}}`) },
      {
        name: 'invalid UTF-8',
        body: () =>
          Buffer.concat([Buffer.from('{"model":"gpt-test","x":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]),
      },
    ];
    const upstreamCallsBefore = gateway.provider.requests.length;
    let accepted = 0;
    for (const { name, body, headers = {}, chunked = false } of cases) {
      const answers = [];
      for (const path of ['/v1/chat/completions', '/v1/chat/completions/']) {
        const text = `${name} ${randomUUID()}`;
        const answer = await rawPost(
          `${gateway.apiUrl}${path}`,
          body(text),
          {
            authorization: bearer(TENANT_A),
            'content-type': 'application/json',
            'idempotency-key': randomUUID(),
            ...headers,
          },
          chunked,
        );
        const upstream = gateway.upstreamCalls(text).length;
        answers.push({ status: answer.status, body: answer.status === 200 ? 'an answer' : answer.body, upstream });
      }
      expect({ name, fast: answers[0] }).toEqual({ name, fast: answers[1] });
      if (answers[0].status === 200) {
        accepted++;
        expect(answers[0].upstream).toBe(1);
      }
    }
    expect(accepted).toBe(6);
    expect(gateway.provider.requests).toHaveLength(upstreamCallsBefore + 2 * accepted);
    expect(throughRouter).toEqual(cases.map(() => 'POST /v1/chat/completions/'));
  });

  it('counts both paths under the route’s label, and a refusal by its status', async () => {
    const [ok, bad] = [await routeCount('200'), await routeCount('401')];
    await post('/v1/chat/completions', { model: 'gpt-test', messages: [{ role: 'user', content: 'counted' }] });
    await post('/v1/chat/completions/', { model: 'gpt-test', messages: [{ role: 'user', content: 'counted' }] });
    for (const path of ['/v1/chat/completions', '/v1/chat/completions/'])
      await fetch(`${gateway.apiUrl}${path}`, {
        method: 'POST',
        body: '{}',
        headers: { 'content-type': 'application/json' },
      });
    await eventually(
      async () => ((await routeCount('200')) === ok + 2 ? true : undefined),
      5000,
      'two answers counted',
    );
    expect(await routeCount('401')).toBe(bad + 2);
  });

  describe('in the log of an api process', () => {
    let api: AppProcess;
    beforeAll(async () => {
      api = await startAppProcess('api', freePort(98), {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key}`,
        LOG_LEVEL: 'info',
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'sk-upstream',
        // Nobody listens there: a 502, which the error filter logs from within the request.
        OPENAI_BASE_URL: `http://127.0.0.1:${freePort(99)}/v1`,
      });
    }, 60_000);
    afterAll(async () => {
      api.kill('SIGTERM');
      await api.exited;
    });

    it('writes the same access line, and the request’s id on what is logged within it', async () => {
      // Served by the fast path: it left neither route to Express.
      expect(api.lines.filter((l) => l.context === 'GatewayFastPath')).toEqual([]);
      const lines = [];
      for (const path of ['/v1/chat/completions', '/v1/chat/completions/']) {
        const res = await fetch(`${api.url}${path}`, {
          method: 'POST',
          headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'unreachable' }] }),
        });
        expect(res.status).toBe(502);
        const id = res.headers.get('x-request-id');
        const of = (msg: string) =>
          api.lines.find((l) => l.msg === msg && (l.req as { id?: unknown } | undefined)?.id === id);
        const [access, warning] = await eventually(
          () => {
            const found = [
              of('request errored'),
              api.lines.find(
                (l) =>
                  typeof l.msg === 'string' &&
                  l.msg.startsWith('502 ') &&
                  (l.req as { id?: unknown } | undefined)?.id === id,
              ),
            ];
            return found.every(Boolean) ? found : undefined;
          },
          5000,
          `the lines of request ${id}`,
        );
        expect(access).toMatchObject({
          level: 30,
          app: 'api',
          req: { id, method: 'POST', url: path },
          res: { statusCode: 502 },
        });
        expect(warning).toMatchObject({ level: 40, context: 'OpenAiErrorFilter', req: { id, url: path } });
        lines.push({ access: Object.keys(access!).sort(), warning: Object.keys(warning!).sort() });
      }
      expect(lines[0]).toEqual(lines[1]);
    });
  });
});

describe('an app whose gateway routes have other parts than the fast path runs', () => {
  @Module({ providers: [{ provide: APP_INTERCEPTOR, useClass: ClassSerializerInterceptor }] })
  class SerializerModule {}

  const seenBy = (x: string) => (req: IncomingMessage, _res: ServerResponse, next: () => void) => {
    req.headers['x-seen-by'] = x;
    next();
  };
  @Module({})
  class ExtraMiddlewareModule implements NestModule {
    configure(consumer: MiddlewareConsumer): void {
      consumer.apply(seenBy('extra')).forRoutes('*');
    }
  }

  it.each([
    ['a global interceptor', SerializerModule],
    ['a Nest middleware', ExtraMiddlewareModule],
  ])('with %s, leaves the routes to Express and Nest, and says so', async (_, extra) => {
    const api = await startApi({ env: { LLM_PROVIDER: 'fake', LOG_LEVEL: 'silent' }, outerImports: [extra] });
    try {
      const routed: string[] = [];
      recordRouted(api.app, (seen) => routed.push(seen));
      const res = await request(api.server)
        .post('/v1/chat/completions')
        .set('authorization', bearer(TENANT_A))
        .send({ model: 'gpt-test', messages: [{ role: 'user', content: 'routed' }] });
      expect(res.status).toBe(200);
      expect(routed).toEqual(['POST /v1/chat/completions']);
    } finally {
      await api.close();
    }
  });
});

/** A POST of exactly these bytes: with a Content-Length, or chunked. */
function rawPost(
  url: string,
  body: Buffer,
  headers: Record<string, string>,
  chunked: boolean,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method: 'POST', headers: chunked ? headers : { ...headers, 'content-length': String(body.length) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (chunked) {
      req.write(body.subarray(0, 10));
      req.end(body.subarray(10));
    } else req.end(body);
  });
}

/** Calls `seen` for each request that reaches Express's router past the fast path (a layer right behind it). */
function recordRouted(app: INestApplication, seen: (request: string) => void): void {
  const router = (app.getHttpAdapter().getInstance() as { router: ExpressRouter }).router;
  const fastPath = router.stack.findIndex((layer) => layer.handle.name === 'middleware');
  expect(fastPath).toBeGreaterThanOrEqual(0);
  router.use((req, _res, next) => {
    seen(`${req.method} ${req.url}`);
    next();
  });
  router.stack.splice(fastPath + 1, 0, router.stack.pop()!);
}

interface ExpressLayer {
  readonly handle: { readonly name: string };
}
interface ExpressRouter {
  readonly stack: ExpressLayer[];
  use(handler: (req: { method: string; url: string }, res: unknown, next: () => void) => void): void;
}
