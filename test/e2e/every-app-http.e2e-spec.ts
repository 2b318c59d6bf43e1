import { connect } from 'node:net';
import { type AppProcess, type BuiltApp, startAppProcess } from '../support/app-process';
import { eventually, freePort, testDatabaseUrl, testRedisUrl } from '../support/infra';
import { metricValue } from '../support/metrics';

/**
 * The worker's and the relay's HTTP servers (health and metrics) as their
 * main.ts runs them: the same rules as the api's. Every answer carries
 * X-Request-Id and is logged and counted, a body sent where none is taken
 * included (Nest's default body parser, which answered its own errors
 * unlogged, is off), and a client that never finishes its request is cut
 * off by the server's own timeout.
 */
/**
 * A warning raised while the app is being built (Node emits it on a later tick), as a dependency's deprecation would
 * be.
 */
const EARLY_WARNING = `data:text/javascript,${encodeURIComponent("setTimeout(() => process.emitWarning('raised while the app starts', 'TestWarning'), 0);")}`;

describe.each<[BuiltApp, number]>([
  ['worker', 80],
  ['relay', 81],
])('the %s process over HTTP', (app, port) => {
  let proc: AppProcess;

  beforeAll(async () => {
    proc = await startAppProcess(
      app,
      freePort(port),
      {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        LOG_LEVEL: 'info',
        HTTP_REQUEST_TIMEOUT_S: '1',
      },
      ['--import', EARLY_WARNING],
    );
  }, 120_000);
  afterAll(async () => {
    proc?.kill('SIGTERM');
    await proc?.exited;
  });

  const lineOf = (id: string) =>
    eventually(
      () => proc.lines.find((l) => (l.req as { id?: string } | undefined)?.id === id && 'res' in l),
      5000,
      `the line of ${id}`,
    );

  it.each([
    ['a malformed JSON body', '{"a":', 'application/json'],
    ['a body over the api’s own limit', `{"a":"${'x'.repeat(2 * 1024 * 1024)}"}`, 'application/json'],
  ])(
    '%s to a route that takes none: 404 problem+json, with its request id, logged and counted',
    async (_, body, type) => {
      const id = `${app}-${Math.random().toString(36).slice(2)}`;
      const labels = { method: 'POST', route: 'unmatched', status: '404' };
      const before = await metricValue(proc.url, 'http_request_duration_seconds_count', labels);
      const res = await fetch(`${proc.url}/health/live`, {
        method: 'POST',
        headers: { 'content-type': type, 'x-request-id': id },
        body,
      });
      expect(res.status).toBe(404);
      expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(res.headers.get('x-request-id')).toBe(id);
      expect(((await lineOf(id)).res as { statusCode: number }).statusCode).toBe(404);
      expect(await metricValue(proc.url, 'http_request_duration_seconds_count', labels)).toBe(before + 1);
    },
  );

  it('a query string is logged with its names and its path, never its values', async () => {
    const id = `${app}-query-${Math.random().toString(36).slice(2)}`;
    const res = await fetch(`${proc.url}/nope?key=query-secret-${app}&page=2`, { headers: { 'x-request-id': id } });
    expect(res.status).toBe(404);
    const line = await lineOf(id);
    expect((line.req as { url?: string }).url).toBe('/nope?key=[redacted]&page=[redacted]');
    expect(proc.stdout()).not.toContain(`query-secret-${app}`);
  });

  it("Node's process warnings are JSON log lines, not text on stderr, even one raised before the logger existed", async () => {
    const line = await eventually(() => proc.lines.find((l) => l.warning === 'TestWarning'), 5000, 'the warning line');
    expect(line).toMatchObject({ level: 40, msg: 'raised while the app starts', context: 'ProcessWarning' });
    expect(proc.stderr()).toBe('');
  });

  it('a successful probe is counted but not logged; every answer carries X-Request-Id', async () => {
    const id = `${app}-probe-${Math.random().toString(36).slice(2)}`;
    const res = await fetch(`${proc.url}/health/live`, { headers: { 'x-request-id': id } });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe(id);
    expect(res.headers.get('keep-alive')).toBe('timeout=65');
    // A later answer's line is there, so the probe's would have been too.
    const marker = `${app}-marker-${Math.random().toString(36).slice(2)}`;
    await fetch(`${proc.url}/nope`, { headers: { 'x-request-id': marker } });
    await lineOf(marker);
    expect(proc.lines.some((l) => (l.req as { id?: string } | undefined)?.id === id)).toBe(false);
  });

  it("a client that never finishes its headers is cut off with a 408 by the server's own timeout, logged and counted", async () => {
    const before = await metricValue(proc.url, 'http_parser_refusals_total', { status: '408' });
    const answer = await new Promise<string>((resolve) => {
      // Half-open allowed: only the server closing for good ends it.
      const socket = connect({ port: Number(new URL(proc.url).port), host: '127.0.0.1', allowHalfOpen: true });
      let got = '';
      let timer: NodeJS.Timeout | undefined;
      socket.on('connect', () => {
        socket.write('GET /health/live HTTP/1.1\r\nHost: x\r\n');
        timer = setInterval(() => socket.write('X-Slow: 1\r\n'), 200);
      });
      socket.on('data', (d: Buffer) => (got += d.toString()));
      socket.on('error', () => undefined);
      socket.on('close', () => {
        clearInterval(timer);
        resolve(got);
      });
    });
    expect(answer).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
    const id = /\r\nX-Request-Id: ([\w-]+)\r\n/.exec(answer)?.[1];
    await eventually(
      () => proc.lines.find((l) => (l.req as { id?: string } | undefined)?.id === id),
      5000,
      'the refusal line',
    );
    expect(await metricValue(proc.url, 'http_parser_refusals_total', { status: '408' })).toBe(before + 1);
  });
});
