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

  /** Jobs of their own, with their messages. */
  const jobs = (n: number) =>
    Array.from({ length: n }, (_, i) => {
      const jobId = `6f1c7a52-3f7e-5b8e-9b0e-${String(i + 1).padStart(12, '0')}`;
      return {
        done: { jobId, tenant: 'acme', summary: `Summary ${i}.` },
        message: summaryReadyMessage(jobId, 'a@b.c'),
      };
    });

  it('group commit: jobs that finish together are written by one statement, each with its own outcome', async () => {
    await writer.writeWithNotification(job, message);
    // A pass-through spy: the statements still go to PostgreSQL.
    const query = jest.spyOn(ds, 'query');
    const batch = jobs(20);
    const outcomes = await Promise.all([
      ...batch.map((j) => writer.writeWithNotification(j.done, j.message)),
      writer.writeWithNotification(job, message),
    ]);
    expect(outcomes).toEqual([...batch.map(() => 'done'), 'duplicate']);
    expect(query).toHaveBeenCalledTimes(1);
    query.mockRestore();
    expect(await count('summaries')).toBe(21);
    const rows: { dedupe_key: string; payload: unknown }[] = await ds.query('SELECT dedupe_key, payload FROM outbox');
    expect(rows).toHaveLength(21);
    for (const j of batch)
      expect(rows).toContainEqual({ dedupe_key: j.message.dedupeKey, payload: { job_id: j.done.jobId, to: 'a@b.c' } });
    expect(await ds.query('SELECT summary FROM summaries WHERE job_id = $1', [batch[7].done.jobId])).toEqual([
      { summary: 'Summary 7.' },
    ]);
  });

  it('group commit: one job id in two letter cases in one turn is one summary, one outbox row, one done', async () => {
    const lower = jobs(1)[0];
    const upper = {
      done: { ...lower.done, jobId: lower.done.jobId.toUpperCase() },
      message: summaryReadyMessage(lower.done.jobId.toUpperCase(), 'a@b.c'),
    };
    const outcomes = await Promise.all([
      writer.writeWithNotification(lower.done, lower.message),
      writer.writeWithNotification(upper.done, upper.message),
    ]);
    expect([...outcomes].sort()).toEqual(['done', 'duplicate']);
    expect(await count('summaries')).toBe(1);
    expect(await count('outbox')).toBe(1);
  });

  it('group commit: a batch that fails for want of the database fails each job once, without a statement each', async () => {
    const query = jest
      .spyOn(ds, 'query')
      .mockRejectedValueOnce(Object.assign(new Error('connection reset'), { code: 'ECONNRESET' }));
    const batch = jobs(4);
    const settled = await Promise.allSettled(batch.map((j) => writer.writeWithNotification(j.done, j.message)));
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected', 'rejected', 'rejected']);
    expect(query).toHaveBeenCalledTimes(1);
    query.mockRestore();
    expect(await count('summaries')).toBe(0);
  });

  it('group commit: a job whose rows cannot be written fails alone; the rest of its batch is written', async () => {
    const batch = jobs(5);
    await ds.query(`INSERT INTO outbox (topic, dedupe_key, payload) VALUES ('t', $1, '{}')`, [
      batch[2].message.dedupeKey,
    ]);
    const settled = await Promise.allSettled(batch.map((j) => writer.writeWithNotification(j.done, j.message)));
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect(String((settled[2] as PromiseRejectedResult).reason)).toMatch(/outbox_dedupe_key_unique/);
    const stored: { job_id: string }[] = await ds.query('SELECT job_id FROM summaries ORDER BY job_id');
    expect(stored.map((r) => r.job_id)).toEqual([0, 1, 3, 4].map((i) => batch[i].done.jobId));
    expect(await count('outbox')).toBe(5);
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

  it('notifies the outbox channel of every row a batch wrote', async () => {
    const { seen, end } = await listen();
    try {
      await Promise.all(jobs(3).map((j) => writer.writeWithNotification(j.done, j.message)));
      const ids: { id: string }[] = await ds.query('SELECT id FROM outbox');
      expect(ids).toHaveLength(3);
      await eventually(() => (seen.length >= 3 ? true : undefined), 2000, 'three notifications');
      expect([...seen].sort()).toEqual(ids.map((r) => String(r.id)).sort());
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
