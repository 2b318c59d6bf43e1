import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { eventually, freePort, testDatabaseUrl } from '../support/infra';

const ROOT = join(__dirname, '..', '..');

/** The built api as a real process: its logs as an operator sees them, its start-up errors, and SIGTERM. */
describe('api process', () => {
  let api: AppProcess | undefined;
  afterAll(() => api?.kill('SIGKILL'));

  it('logs JSON lines that carry the request id, never the keys, and exits 0 on SIGTERM', async () => {
    api = await startAppProcess('api', freePort(30), {
      // Nothing listens here: the idempotency store is unreachable, which the api logs.
      REDIS_URL: `redis://127.0.0.1:${freePort(31)}`,
      DATABASE_URL: testDatabaseUrl(),
      API_KEYS: 'acme:acme-secret-key-0123456789',
      LOG_LEVEL: 'info',
    });
    const { lines } = api;

    const res = await fetch(`${api.url}/v1/summaries`, {
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
    const all = JSON.stringify(lines);
    expect(all).not.toContain('acme-secret-key-0123456789');
    expect(all).not.toContain('very-secret-idempotency-key-42');
    expect(all).not.toContain('confidential text');
    expect(lines.every((l) => l.app === 'api' && typeof l.level === 'number')).toBe(true);

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
