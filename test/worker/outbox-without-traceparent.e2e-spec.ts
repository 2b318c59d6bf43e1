import { dataSourceOptions } from '@app/persistence';
import { Client } from 'pg';
import { DataSource } from 'typeorm';
import { OutboxRelayRepository } from '../../apps/relay/src/outbox/outbox-relay.repository';
import { compileRelay, FakeProvider } from '../relay/relay-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { BASE_DATABASE_URL, freePort, freshRedis, testDatabaseName } from '../support/infra';
import { drain, startTriageRun, workerPool } from '../support/triage-runs';

/**
 * A rolling upgrade to the release that brought traces, tracing off: the new
 * worker and relay meet a database whose outbox has no `traceparent` column
 * yet (the migration Job not run, or not finished). Untraced, neither names
 * the column, so a step's outbox row is committed and the relay sends it.
 * Traced, the relay's claim reads it, which is why docs/operations.md says to
 * migrate before turning traces on.
 */
describe('the outbox before its traceparent column, tracing off', () => {
  const name = `${testDatabaseName()}_no_traceparent`;
  const url = Object.assign(new URL(BASE_DATABASE_URL), { pathname: `/${name}` }).toString();
  let admin: Client;
  let db: DataSource;
  let model: FakeOpenAiServer;
  let provider: FakeProvider;
  const workers = workerPool(() => model.baseUrl);

  beforeAll(async () => {
    admin = new Client({ connectionString: BASE_DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
    db = new DataSource(dataSourceOptions({ url, applicationName: 'test' }));
    await db.initialize();
    await db.runMigrations();
    // The schema as the release before traces left it.
    await db.query('ALTER TABLE outbox DROP COLUMN traceparent');
    model = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'billing' })).start();
    provider = await FakeProvider.start(freePort(96));
  });
  afterAll(async () => {
    await workers.closeAll();
    await provider?.close();
    await model?.stop();
    await db?.destroy();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  });

  it("a step's outbox row commits, and a relay pass claims and sends it", async () => {
    const redis = await freshRedis();
    try {
      const w = await workers.start({ DATABASE_URL: url });
      const { runId } = await startTriageRun(redis);
      // classify, draft, notify: the last one's commit writes the outbox row.
      expect(await drain(w)).toEqual(['done', 'done', 'done']);
      expect(await db.query(`SELECT status FROM workflow_runs WHERE run_id = $1`, [runId])).toEqual([
        { status: 'done' },
      ]);
      const key = `triage_ready:${runId}`;
      expect(await db.query(`SELECT dedupe_key, sent_at FROM outbox`)).toEqual([{ dedupe_key: key, sent_at: null }]);

      const relay = await compileRelay({ env: { DATABASE_URL: url, NOTIFY_WEBHOOK_URL: provider.url } });
      try {
        await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1, failed: 0, unrecorded: 0 });
      } finally {
        await relay.close();
      }
      expect(provider.deliveries.map((d) => d.idempotencyKey)).toEqual([key]);
      expect(await db.query(`SELECT count(*)::int AS n FROM outbox WHERE sent_at IS NOT NULL`)).toEqual([{ n: 1 }]);
    } finally {
      redis.disconnect();
    }
  });

  it('traced, the claim reads the column: it fails on this schema (42703), so traces wait for the migration', async () => {
    const repository = new OutboxRelayRepository();
    await expect(repository.claim(db.manager, 10, 1000, 10, false)).resolves.toEqual([]);
    await expect(repository.claim(db.manager, 10, 1000, 10, true)).rejects.toMatchObject({
      driverError: { code: '42703' },
    });
  });
});
