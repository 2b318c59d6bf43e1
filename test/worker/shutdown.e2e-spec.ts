import { CONSUMER_GROUP, jobIdFor, JOBS_STREAM, SummaryJobQueue } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import {
  eventually,
  freePort,
  freshRedis,
  testDatabaseUrl,
  testDataSource,
  testRedisUrl,
  truncateAll,
} from '../support/infra';

const ROOT = join(__dirname, '..', '..');

/** The built worker as a real process: SIGTERM is a signal, not a method call. */
describe('worker process on SIGTERM', () => {
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let child: ChildProcess | undefined;

  beforeAll(async () => {
    redis = await freshRedis();
    db = await testDataSource();
    await truncateAll(db);
    model = await new FakeOpenAiServer(() => ({
      kind: 'complete',
      content: 'Finished during the drain.',
      delayMs: 1500,
    })).start();
  }, 120_000);
  afterAll(async () => {
    child?.kill('SIGKILL');
    await model.stop();
    await db.destroy();
    redis.disconnect();
  });

  it('lets the job in flight finish, acks it, and exits 0', async () => {
    const healthPort = freePort(10);
    const output: string[] = [];
    child = spawn(process.execPath, [join(ROOT, 'dist', 'apps', 'worker', 'main.js')], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH,
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        HEALTH_PORT: String(healthPort),
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'test-key',
        OPENAI_BASE_URL: model.baseUrl,
        LOG_LEVEL: 'info',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout?.on('data', (d: Buffer) => output.push(d.toString()));
    child.stderr?.on('data', (d: Buffer) => output.push(d.toString()));
    const exited = once(child, 'exit');

    await eventually(
      async () =>
        (await fetch(`http://127.0.0.1:${healthPort}/health/ready`).catch(() => undefined))?.ok ? true : undefined,
      15_000,
      'the worker to be ready',
    );
    const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
    await new SummaryJobQueue(redis).enqueue({
      jobId,
      tenant: 'tenant-a',
      payload: { text: 'Drain me.', notify: 'a@example.com' },
    });
    await eventually(() => (model.calls === 1 ? true : undefined), 10_000, 'the model call to start');

    child.kill('SIGTERM');
    const [code, signal] = (await exited) as [number | null, string | null];
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    expect(model.calls).toBe(1);
    expect(model.requests[0].closedEarly).toBe(false);
    expect(await db.query('SELECT job_id, summary FROM summaries')).toEqual([
      { job_id: jobId, summary: 'Finished during the drain.' },
    ]);
    expect(Number(((await redis.xpending(JOBS_STREAM, CONSUMER_GROUP)) as [number])[0])).toBe(0);
    expect(await redis.xlen(JOBS_STREAM)).toBe(0);
    // Nothing was pending for it, so it left the group: consumer names do not pile up across restarts.
    expect(await redis.xinfo('CONSUMERS', JOBS_STREAM, CONSUMER_GROUP)).toEqual([]);
    const lines = output
      .join('')
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.some((l) => l.msg === 'draining 1 in-flight job(s)')).toBe(true);
    // The job's lines carry its id from the logging context, not from each call.
    expect(lines.find((l) => l.msg === 'job finished')).toMatchObject({ job_id: jobId, result: 'done', app: 'worker' });
  }, 60_000);
});
