import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { eventually, freePort, testDatabaseUrl } from '../support/infra';

const ROOT = join(__dirname, '..', '..');

/** The built api as a real process: its logs as an operator sees them, and SIGTERM. */
describe('api process', () => {
  let child: ChildProcess | undefined;
  beforeAll(() => {
    execFileSync(join(ROOT, 'node_modules', '.bin', 'nest'), ['build', 'api'], { cwd: ROOT, stdio: 'pipe' });
  }, 120_000);
  afterAll(() => child?.kill('SIGKILL'));

  it('logs JSON lines that carry the request id, never the keys, and exits 0 on SIGTERM', async () => {
    const port = freePort(30);
    const lines: Record<string, unknown>[] = [];
    let buffer = '';
    child = spawn(process.execPath, [join(ROOT, 'dist', 'apps', 'api', 'main.js')], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH,
        PORT: String(port),
        // Nothing listens here: the idempotency store is unreachable, which the api logs.
        REDIS_URL: `redis://127.0.0.1:${freePort(31)}`,
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: 'acme:acme-secret-key-0123456789',
        LOG_LEVEL: 'info',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout?.on('data', (d: Buffer) => {
      buffer += d.toString();
      const parts = buffer.split('\n');
      buffer = parts.pop() ?? '';
      for (const part of parts) if (part.startsWith('{')) lines.push(JSON.parse(part) as Record<string, unknown>);
    });
    const exited = once(child, 'exit');
    await eventually(async () => ((await fetch(`http://127.0.0.1:${port}/health/live`).catch(() => undefined))?.ok ? true : undefined), 20_000, 'the api');

    const res = await fetch(`http://127.0.0.1:${port}/v1/summaries`, {
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
    await eventually(() => (lines.some((l) => l.msg === 'request errored') ? true : undefined), 5000, 'the request line');

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

    child.kill('SIGTERM');
    const [code, signal] = (await exited) as [number | null, string | null];
    expect({ code, signal }).toEqual({ code: 0, signal: null });
  }, 60_000);
});
