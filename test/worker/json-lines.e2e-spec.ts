import { jobIdFor, SummaryJobQueue } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { type AppProcess, startAppProcess } from '../support/app-process';
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
  let worker: AppProcess | undefined;

  beforeAll(async () => {
    redis = await freshRedis();
    db = await testDataSource();
    await truncateAll(db);
    // No call is answered before a whole slot's worth is open at once (then none waits), however slowly a loaded
    // machine opens them. A worker that never opens that many gets its answers 5 s after its first call, and the
    // peak below fails the test.
    const slotsOpen = Promise.withResolvers<void>();
    model = await new FakeOpenAiServer(async (n) => {
      if (n === 1) setTimeout(slotsOpen.resolve, 5000).unref();
      if (model.peakConcurrency >= CONCURRENCY - 4) slotsOpen.resolve();
      await slotsOpen.promise;
      return { kind: 'complete', content: `Summary ${n}.` };
    }).start();
  }, 120_000);
  afterAll(async () => {
    worker?.kill('SIGKILL');
    await model.stop();
    await db.destroy();
    redis.disconnect();
  });

  it(`runs ${JOBS} jobs ${CONCURRENCY} at a time, exits 0 on SIGTERM, and every stdout and stderr line is JSON`, async () => {
    worker = await startAppProcess(
      'worker',
      freePort(11),
      {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        WORKER_CONCURRENCY: String(CONCURRENCY),
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'x',
        OPENAI_BASE_URL: model.baseUrl,
        LOG_LEVEL: 'info',
      },
      ['--import', CLASSIC_SIGNAL_LIMIT],
    );
    await eventually(
      async () => ((await fetch(`${worker!.url}/health/ready`).catch(() => undefined))?.ok ? true : undefined),
      15_000,
      'the worker to be ready',
    );
    const queue = new SummaryJobQueue(redis);
    const jobIds = Array.from({ length: JOBS }, () => jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`));
    await Promise.all(
      jobIds.map((jobId) =>
        queue.enqueue({ jobId, tenant: 'tenant-a', payload: { text: `Text of ${jobId}.`, notify: 'a@example.com' } }),
      ),
    );

    const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`))[0].n);
    await eventually(async () => ((await count('summaries')) === JOBS ? true : undefined), 15_000, `${JOBS} summaries`);
    expect(await count('outbox')).toBe(JOBS);
    expect(model.calls).toBe(JOBS);
    // The point of the test: a slot's worth of calls really was open at once.
    expect(model.peakConcurrency).toBeGreaterThanOrEqual(CONCURRENCY - 4);

    worker.kill('SIGTERM');
    // Resolves once both pipes have closed: nothing the process wrote is lost.
    expect(await worker.exited).toEqual({ code: 0, signal: null });

    const out = worker.stdout();
    const err = worker.stderr();
    expect(out.split('\n').filter((l) => l.includes('"msg":"job finished"'))).toHaveLength(JOBS);
    expect({ stdout: notJson(out), stderr: notJson(err) }).toEqual({ stdout: [], stderr: [] });
    // Process warnings go through the logger as JSON lines (serveHttpApp), so JSON alone is not enough: none was
    // raised.
    expect(out.split('\n').filter((l) => l.includes('"warning":'))).toEqual([]);
  }, 30_000);
});
