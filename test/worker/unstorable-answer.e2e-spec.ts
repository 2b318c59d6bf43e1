import { DEAD_LETTER_STREAM, fieldsOf, jobIdFor, SummaryJobQueue } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker, type WorkerHarness } from '../support/worker-harness';

/**
 * A model answer PostgreSQL cannot store as it is: text refuses U+0000, and
 * an unpaired UTF-16 surrogate has no UTF-8 form. The answer arrives through
 * the real SDK and JSON (`\u0000`, `\ud800` escapes) and the job still ends
 * with its summary and its outbox row.
 */
describe('a model answer PostgreSQL cannot store as it is', () => {
  let db: DataSource;
  let redis: Redis;
  let model: FakeOpenAiServer;
  let worker: WorkerHarness;

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer().start();
    redis = await freshRedis();
    worker = await startWorker({ modelUrl: model.baseUrl });
  });
  afterAll(async () => {
    await worker.close();
    await model.stop();
    await db.destroy();
    redis.disconnect();
  });
  beforeEach(async () => {
    await redis.flushdb();
    await truncateAll(db);
    model.requests.length = 0;
  });

  const run = async (content: string) => {
    model.reply = () => ({ kind: 'complete', content });
    const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
    await new SummaryJobQueue(redis).enqueue({
      jobId,
      tenant: 'tenant-a',
      payload: { text: 'Some text.', notify: 'a@example.com' },
    });
    const [delivery] = await worker.consumer.runOnce();
    return { jobId, outcome: delivery?.outcome };
  };
  const stored = () => db.query('SELECT job_id, summary FROM summaries');
  const outboxRows = async () => Number((await db.query('SELECT count(*) AS n FROM outbox'))[0].n);

  it('drops a NUL and stores the rest', async () => {
    const { jobId, outcome } = await run('A summary\u0000 with a NUL in it.\u0000');
    expect(outcome).toBe('done');
    expect(await stored()).toEqual([{ job_id: jobId, summary: 'A summary with a NUL in it.' }]);
    expect(await outboxRows()).toBe(1);
    expect(model.calls).toBe(1);
  });

  it('stores an unpaired surrogate as U+FFFD, and keeps a real pair', async () => {
    const { jobId, outcome } = await run('Broken \ud800 here, \udc00 there, intact \ud83d\ude00.');
    expect(outcome).toBe('done');
    expect(await stored()).toEqual([
      { job_id: jobId, summary: 'Broken \ufffd here, \ufffd there, intact \ud83d\ude00.' },
    ]);
    expect(await outboxRows()).toBe(1);
  });

  it('an answer of nothing but NULs and whitespace is an empty answer: one call, dead-lettered, nothing stored', async () => {
    const { jobId, outcome } = await run('\u0000 \n\u0000');
    expect(outcome).toBe('dead_lettered');
    expect(model.calls).toBe(1);
    expect(await stored()).toEqual([]);
    expect(await outboxRows()).toBe(0);
    const letters = (await redis.xrange(DEAD_LETTER_STREAM, '-', '+')).map(([, flat]) => fieldsOf(flat));
    expect(letters).toEqual([expect.objectContaining({ job_id: jobId, reason: 'llm_empty_answer' })]);
  });
});
