import { dataSourceOptions } from '@app/persistence';
import {
  CONSUMER_GROUP,
  DEAD_LETTER_STREAM,
  jobIdFor,
  jobRecordKey,
  JOBS_STREAM,
  SummaryJobQueue,
} from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import { DataSource } from 'typeorm';
import { isTransientDatabaseError } from '@app/workflows';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { BASE_DATABASE_URL, freshRedis, testDatabaseName, testDataSource } from '../support/infra';
import { idlePast } from '../support/pending-entries';
import { startWorker } from '../support/worker-harness';

/**
 * A rollout runs the migration Job alongside the new workers: a worker may
 * take jobs before the tables it writes exist. Those jobs wait; they are not
 * dead-lettered.
 */
describe('a worker whose database is not migrated yet', () => {
  const name = `${testDatabaseName()}_unmigrated`;
  const url = Object.assign(new URL(BASE_DATABASE_URL), { pathname: `/${name}` }).toString();
  let admin: Client;
  let redis: Redis;
  let model: FakeOpenAiServer;

  beforeAll(async () => {
    admin = new Client({ connectionString: BASE_DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
    model = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'Once the tables were there.' })).start();
    redis = await freshRedis();
  });
  afterAll(async () => {
    redis.disconnect();
    await model.stop();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  });

  it('leaves the job pending, not dead-lettered, until the migration has run, then runs it', async () => {
    const w = await startWorker({ modelUrl: model.baseUrl, env: { DATABASE_URL: url, CLAIM_IDLE_MS: '200' } });
    const migrated = new DataSource(dataSourceOptions({ url, applicationName: 'test-migration' }));
    try {
      const jobId = jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`);
      const id = await new SummaryJobQueue(redis).enqueue({
        jobId,
        tenant: 'tenant-a',
        payload: { text: 'Early.', notify: 'a@example.com' },
      });
      expect(await w.consumer.runOnce()).toEqual([{ id, deliveries: 1, outcome: 'transient' }]);
      expect(model.calls).toBe(0); // the pre-check failed first
      expect(await redis.xlen(DEAD_LETTER_STREAM)).toBe(0);
      expect((await redis.hgetall(jobRecordKey(jobId))).status).toBeUndefined();

      // The migration Job finishes.
      await migrated.initialize();
      await migrated.runMigrations();
      // The entry left pending is idle past CLAIM_IDLE_MS, by XPENDING's own idle time: claimable.
      await idlePast(redis, JOBS_STREAM, CONSUMER_GROUP, 200);
      expect(await w.consumer.runOnce()).toEqual([{ id, deliveries: 2, outcome: 'done' }]);
      expect(await migrated.query('SELECT job_id FROM summaries')).toEqual([{ job_id: jobId }]);
    } finally {
      await w.close();
      if (migrated.isInitialized) await migrated.destroy();
    }
  });

  it.each([
    ['42P01', 'undefined_table', 'SELECT 1 FROM no_such_table'],
    ['42703', 'undefined_column', 'SELECT no_such_column FROM summaries'],
    ['42883', 'undefined_function', 'SELECT no_such_function(1)'],
    ['42704', 'undefined_object', `SELECT 'x'::no_such_type`],
    ['3F000', 'invalid_schema_name', 'CREATE TABLE no_such_schema.t (a int)'],
  ])('counts PostgreSQL %s (%s) as transient', async (code, _name, sql) => {
    const ds = await testDataSource();
    try {
      const err = await ds.query(sql).catch((e: unknown) => e);
      expect(err).toMatchObject({ driverError: { code } });
      expect(isTransientDatabaseError(err)).toBe(true);
    } finally {
      await ds.destroy();
    }
  });

  it('still counts an error in the statement itself as permanent', async () => {
    const ds = await testDataSource();
    try {
      const err = await ds.query(`SELECT 'not a uuid'::uuid`).catch((e: unknown) => e);
      expect(err).toMatchObject({ driverError: { code: '22P02' } });
      expect(isTransientDatabaseError(err)).toBe(false);
    } finally {
      await ds.destroy();
    }
  });
});
