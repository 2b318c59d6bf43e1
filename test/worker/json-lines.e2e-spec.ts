import { jobIdFor, SummaryJobQueue } from '@app/jobs';
import type { Redis } from 'ioredis';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { join } from 'node:path';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freePort, freshRedis, testDatabaseUrl, testDataSource, testRedisUrl, truncateAll } from '../support/infra';

const ROOT = join(__dirname, '..', '..');
const CONCURRENCY = 64;
const JOBS = 150;

/**
 * Node 24 no longer warns about listeners on an AbortSignal (nodejs/node#55816
 * set its limit to 0), so a pile-up on the consumer's shared signal would go
 * unseen here. This preload gives every AbortController's signal back the
 * EventTarget default of 10, as older runtimes and other signal libraries
 * have: one listener per job on a shared signal then prints the warning.
 */
const CLASSIC_SIGNAL_LIMIT = `data:text/javascript,${encodeURIComponent(
  'import { setMaxListeners } from "node:events";' +
    'const Native = globalThis.AbortController;' +
    'globalThis.AbortController = class AbortController extends Native { constructor() { super(); setMaxListeners(10, this.signal); } };',
)}`;

/** Lines of a stream that do not parse as JSON (a trailing newline leaves no line). */
const notJson = (text: string): string[] =>
  text
    .split('\n')
    .filter((line, i, all) => !(line === '' && i === all.length - 1))
    .filter((line) => {
      try {
        JSON.parse(line);
        return false;
      } catch {
        return true;
      }
    });

/**
 * The built worker under real concurrency: 64 slow model calls at once, all
 * under the consumer's one shared hard-stop signal. Its log is read by
 * machines, so every line it writes, on either stream, is JSON: no warning
 * from Node about listeners piling up on a shared signal, as text or as a
 * logged warning.
 */
describe('worker process under load writes JSON lines only', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let child: ChildProcess | undefined;

  beforeAll(async () => {
    execFileSync(join(ROOT, 'node_modules', '.bin', 'nest'), ['build', 'worker'], { cwd: ROOT, stdio: 'pipe' });
    redis = await freshRedis();
    db = await testDataSource();
    await truncateAll(db);
    // Slow enough that a whole slot's worth of calls is open at once.
    model = await new FakeOpenAiServer((n) => ({ kind: 'complete', content: `Summary ${n}.`, delayMs: 300 })).start();
  }, 120_000);
  afterAll(async () => {
    child?.kill('SIGKILL');
    await model.stop();
    await db.destroy();
    redis.disconnect();
  });

  it(`runs ${JOBS} jobs ${CONCURRENCY} at a time, exits 0 on SIGTERM, and every stdout and stderr line is JSON`, async () => {
    const healthPort = freePort(11);
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    child = spawn(process.execPath, ['--import', CLASSIC_SIGNAL_LIMIT, join(ROOT, 'dist', 'apps', 'worker', 'main.js')], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH,
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        HEALTH_PORT: String(healthPort),
        WORKER_CONCURRENCY: String(CONCURRENCY),
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'x',
        OPENAI_BASE_URL: model.baseUrl,
        LOG_LEVEL: 'info',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout?.on('data', (d: Buffer) => stdout.push(d));
    child.stderr?.on('data', (d: Buffer) => stderr.push(d));
    const exited = once(child, 'exit');
    // 'close' comes after both pipes have ended: nothing the process wrote is lost.
    const closed = once(child, 'close');

    await eventually(
      async () => ((await fetch(`http://127.0.0.1:${healthPort}/health/ready`).catch(() => undefined))?.ok ? true : undefined),
      15_000,
      'the worker to be ready',
    );
    const queue = new SummaryJobQueue(redis);
    const jobIds = Array.from({ length: JOBS }, () => jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`));
    await Promise.all(jobIds.map((jobId) => queue.enqueue({ jobId, tenant: 'tenant-a', payload: { text: `Text of ${jobId}.`, notify: 'a@example.com' } })));

    const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`))[0].n);
    await eventually(async () => ((await count('summaries')) === JOBS ? true : undefined), 15_000, `${JOBS} summaries`);
    expect(await count('outbox')).toBe(JOBS);
    expect(model.calls).toBe(JOBS);
    // The point of the test: a slot's worth of calls really was open at once.
    expect(model.peakConcurrency).toBeGreaterThanOrEqual(CONCURRENCY - 4);

    child.kill('SIGTERM');
    const [code, signal] = (await exited) as [number | null, string | null];
    await closed;
    expect({ code, signal }).toEqual({ code: 0, signal: null });

    const out = Buffer.concat(stdout).toString('utf8');
    const err = Buffer.concat(stderr).toString('utf8');
    expect(out.split('\n').filter((l) => l.includes('"msg":"job finished"'))).toHaveLength(JOBS);
    expect({ stdout: notJson(out), stderr: notJson(err) }).toEqual({ stdout: [], stderr: [] });
    // Process warnings go through the logger as JSON lines (serveHttpApp), so JSON alone is not enough: none was raised.
    expect(out.split('\n').filter((l) => l.includes('"warning":'))).toEqual([]);
  }, 30_000);
});
