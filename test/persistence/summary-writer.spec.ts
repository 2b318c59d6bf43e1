import { SUMMARY_READY_TOPIC, summaryReadyDedupeKey, summaryReadyMessage } from '@app/summary-queue';
import { OUTBOX_CHANNEL, SummaryRepository, SummaryWriter } from '@app/persistence';
import { Client } from 'pg';
import type { DataSource } from 'typeorm';
import { eventually, testDatabaseUrl, testDataSource, truncateAll } from '../support/infra';

describe('SummaryWriter (one statement, one transaction: summary and outbox row)', () => {
  let ds: DataSource;
  let writer: SummaryWriter;
  const job = {
    jobId: '6f1c7a52-3f7e-5b8e-9b0e-1d2c3b4a5f60',
    tenant: 'acme',
    summary: 'Short.',
  };
  const message = summaryReadyMessage(job.jobId, 'a@example.com');
  const count = async (table: string) => Number((await ds.query(`SELECT count(*) AS n FROM ${table}`))[0].n);

  beforeAll(async () => {
    ds = await testDataSource();
    writer = new SummaryWriter(ds, new SummaryRepository());
  });
  afterAll(() => ds.destroy());
  beforeEach(() => truncateAll(ds));

  it('writes the summary and one outbox row the first time, and nothing the second', async () => {
    await expect(writer.writeWithNotification(job, message)).resolves.toBe('done');
    await expect(writer.writeWithNotification({ ...job, summary: 'Another run.' }, message)).resolves.toBe('duplicate');
    expect(await ds.query('SELECT job_id, tenant, summary FROM summaries')).toEqual([
      { job_id: job.jobId, tenant: 'acme', summary: 'Short.' },
    ]);
    expect(await ds.query('SELECT topic, dedupe_key, payload, attempts, sent_at FROM outbox')).toEqual([
      {
        topic: SUMMARY_READY_TOPIC,
        dedupe_key: summaryReadyDedupeKey(job.jobId),
        payload: { job_id: job.jobId, to: 'a@example.com' },
        attempts: 0,
        sent_at: null,
      },
    ]);
  });

  it('lets exactly one of many concurrent writers win', async () => {
    const outcomes = await Promise.all(Array.from({ length: 10 }, () => writer.writeWithNotification(job, message)));
    expect(outcomes.filter((o) => o === 'done')).toHaveLength(1);
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
  });

  it('is all or nothing: when the outbox row cannot be written, the summary is not stored either', async () => {
    // An outbox row already holding this job's dedupe key makes the second
    // insert of the statement fail (unique violation) after the first has run.
    await ds.query(`INSERT INTO outbox (topic, dedupe_key, payload) VALUES ('t', $1, '{}')`, [
      summaryReadyDedupeKey(job.jobId),
    ]);
    await expect(writer.writeWithNotification(job, message)).rejects.toThrow(/outbox_dedupe_key_unique/);
    expect(await count('summaries')).toBe(0);
    expect(await count('outbox')).toBe(1);
  });

  /** The relay's view: every payload notified on the outbox channel, from now on. */
  async function listen(): Promise<{ seen: string[]; end: () => Promise<void> }> {
    const listener = new Client({ connectionString: testDatabaseUrl() });
    await listener.connect();
    const seen: string[] = [];
    listener.on('notification', (n) => n.channel === OUTBOX_CHANNEL && seen.push(n.payload ?? ''));
    await listener.query(`LISTEN ${OUTBOX_CHANNEL}`);
    return { seen, end: () => listener.end() };
  }

  it('sends nothing to the relay for a duplicate', async () => {
    await writer.writeWithNotification(job, message);
    const { seen, end } = await listen();
    try {
      await expect(writer.writeWithNotification(job, message)).resolves.toBe('duplicate');
      // Notifications arrive in commit order: once a marker sent after the
      // duplicate's commit is here, anything the duplicate sent would be too.
      await ds.query(`SELECT pg_notify('${OUTBOX_CHANNEL}', 'marker')`);
      await eventually(() => (seen.includes('marker') ? true : undefined), 2000, 'the marker');
      expect(seen).toEqual(['marker']);
    } finally {
      await end();
    }
  });

  it('notifies the outbox channel when the transaction commits', async () => {
    const { seen, end } = await listen();
    try {
      await writer.writeWithNotification(job, message);
      const [{ id }] = await ds.query('SELECT id FROM outbox');
      await eventually(() => (seen.length > 0 ? true : undefined), 2000, 'a notification');
      expect(seen).toEqual([String(id)]);
    } finally {
      await end();
    }
  });
});
