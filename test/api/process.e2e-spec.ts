import { spawnSync } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { eventually, freePort, testDatabaseUrl } from '../support/infra';

const ROOT = join(__dirname, '..', '..');

/** Sends `target`'s headers and the start of a body that never comes; resolves with what the server answered. */
const stalledBody = (base: string, target: string): Promise<string> =>
  new Promise((resolve) => {
    const socket = connect({ port: Number(new URL(base).port), host: '127.0.0.1' });
    let got = '';
    socket.on('connect', () =>
      socket.write(
        `POST ${target} HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":`,
      ),
    );
    socket.on('data', (d: Buffer) => (got += d.toString()));
    socket.on('error', () => undefined);
    socket.on('close', () => resolve(got));
  });

/** The built api as a real process: its logs as an operator sees them, its start-up errors, and SIGTERM. */
describe('api process', () => {
  let api: AppProcess | undefined;
  afterAll(() => api?.kill('SIGKILL'));

  it('logs JSON lines that carry the request id and the path, never the keys or query values, and exits 0 on SIGTERM', async () => {
    api = await startAppProcess('api', freePort(30), {
      // Nothing listens here: the idempotency store is unreachable, which the api logs.
      REDIS_URL: `redis://127.0.0.1:${freePort(31)}`,
      DATABASE_URL: testDatabaseUrl(),
      API_KEYS: 'acme:acme-secret-key-0123456789',
      LOG_LEVEL: 'info',
      HTTP_REQUEST_TIMEOUT_S: '1',
    });
    const { lines } = api;

    const res = await fetch(`${api.url}/v1/summaries?key=query-secret-0123456789&trace`, {
      method: 'POST',
      headers: {
        authorization: 'Bearer acme-secret-key-0123456789',
        'content-type': 'application/json',
        'idempotency-key': 'very-secret-idempotency-key-42',
        'x-request-id': 'req-abc-123',
      },
      body: JSON.stringify({ text: 'A confidential text that must not be logged.', notify: 'who@example.com' }),
    });
    expect(res.status).toBe(503);
    expect(res.headers.get('x-request-id')).toBe('req-abc-123');
    // pino-http's line for the request: 'request errored' for a 5xx.
    await eventually(
      () => (lines.some((l) => l.msg === 'request errored') ? true : undefined),
      5000,
      'the request line',
    );

    const ofRequest = lines.filter((l) => (l.req as { id?: string } | undefined)?.id === 'req-abc-123');
    // The interceptor's own warning and pino-http's request line, both with the request id.
    expect(ofRequest.map((l) => l.msg)).toEqual(
      expect.arrayContaining(['request errored', expect.stringContaining('idempotency store unavailable')]),
    );
    // The path is logged, the query's names too, its values never.
    const line = ofRequest.find((l) => l.msg === 'request errored');
    expect((line?.req as { url?: string } | undefined)?.url).toBe('/v1/summaries?key=[redacted]&[redacted]');
    const all = JSON.stringify(lines);
    expect(all).not.toContain('query-secret-0123456789');
    expect(all).not.toContain('acme-secret-key-0123456789');
    expect(all).not.toContain('very-secret-idempotency-key-42');
    expect(all).not.toContain('confidential text');
    expect(lines.every((l) => l.app === 'api' && typeof l.level === 'number')).toBe(true);

    // A body that stops arriving is answered (408) and logged by the HTTP server itself: its line too keeps the
    // path and drops the query's values.
    const answer = await stalledBody(api.url, '/v1/summaries?key=stalled-secret-0123456789');
    expect(answer).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
    const id = /\r\nX-Request-Id: ([\w-]+)\r\n/.exec(answer)?.[1];
    const refusal = await eventually(
      () => lines.find((l) => (l.req as { id?: string } | undefined)?.id === id),
      5000,
      'the refusal line',
    );
    expect(refusal.req).toMatchObject({ method: 'POST', url: '/v1/summaries?key=[redacted]' });
    expect(JSON.stringify(lines)).not.toContain('stalled-secret-0123456789');

    api.kill('SIGTERM');
    expect(await api.exited).toEqual({ code: 0, signal: null });
  }, 60_000);

  it.each([
    [
      'an entry that reads two ways',
      'acme:ok-key-0123456789abcdef,acme:POST:secret-key-0123456789',
      'entry 2 has more than one',
    ],
    ['a key written first', 'secret-key-0123456789abcdef:acme', 'entry 1: keys must be at least 16 characters'],
  ])('a bad API_KEYS (%s) stops the start: exit 1, one line naming the entry, never the key', (_, apiKeys, message) => {
    const run = spawnSync(process.execPath, [join(ROOT, 'dist', 'apps', 'api', 'main.js')], {
      env: { PATH: process.env.PATH, NODE_ENV: 'production', API_KEYS: apiKeys, PORT: String(freePort(32)) },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr).toMatch(/^api: Invalid configuration: API_KEYS /);
    expect(run.stderr).toContain(message);
    expect(run.stderr).not.toContain('secret-key');
    expect(run.stdout).toBe('');
  });
});
