import { randomUUID } from 'node:crypto';
import { bearer, TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
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
    // A layer right behind the fast path's (the first of the app's own): it sees what the fast path passed on.
    const router = (gateway.api.app.getHttpAdapter().getInstance() as { router: ExpressRouter }).router;
    const fastPath = router.stack.findIndex((layer) => layer.handle.name === 'middleware');
    expect(fastPath).toBeGreaterThanOrEqual(0);
    router.use((req, _res, next) => {
      throughRouter.push(`${req.method} ${req.url}`);
      next();
    });
    router.stack.splice(fastPath + 1, 0, router.stack.pop()!);
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

interface ExpressLayer {
  readonly handle: { readonly name: string };
}
interface ExpressRouter {
  readonly stack: ExpressLayer[];
  use(handler: (req: { method: string; url: string }, res: unknown, next: () => void) => void): void;
}
