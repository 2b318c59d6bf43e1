import { OutboxAdminRepository } from '@app/persistence';
import type { DataSource } from 'typeorm';
import { testDataSource, truncateAll } from '../support/infra';

describe('OutboxAdminRepository.figures (the outbox gauges and admin stats)', () => {
  let ds: DataSource;
  const repo = new OutboxAdminRepository();

  /** Rows in every state; `created` is how long ago each was written. */
  const insert = (key: string, created: string, state: { sent?: boolean; parked?: boolean } = {}) =>
    ds.query(
      `INSERT INTO outbox (topic, dedupe_key, payload, created_at, sent_at, parked_at)
       VALUES ('t', $1, '{}', now() - $2::interval,
               CASE WHEN $3::boolean THEN now() END, CASE WHEN $4::boolean THEN now() END)`,
      [key, created, state.sent ?? false, state.parked ?? false],
    );

  beforeAll(async () => {
    ds = await testDataSource();
  });
  afterAll(() => ds.destroy());
  beforeEach(() => truncateAll(ds));

  it('is all zeros for an empty outbox', async () => {
    await expect(repo.figures(ds.manager)).resolves.toEqual({ backlog: 0, parked: 0, oldestUnsentAgeSeconds: 0 });
  });

  it('counts unsent rows being tried and parked rows apart; sent rows, however old, count for nothing', async () => {
    await insert('sent-long-ago', '3 days', { sent: true });
    await insert('sent-after-a-requeue', '2 days', { sent: true, parked: true });
    await insert('pending-old', '1 hour');
    await insert('pending-new', '1 second');
    await insert('parked-older', '5 hours', { parked: true });

    const figures = await repo.figures(ds.manager);
    expect(figures).toMatchObject({ backlog: 2, parked: 1 });
    // The oldest pending row, not the older parked or sent ones.
    expect(figures.oldestUnsentAgeSeconds).toBeGreaterThanOrEqual(3600);
    expect(figures.oldestUnsentAgeSeconds).toBeLessThan(3600 + 60);
  });

  it('can be answered from the partial indexes of unsent rows, without reading the sent history', async () => {
    await insert('sent', '1 day', { sent: true });
    await insert('pending', '1 minute');
    await insert('parked', '1 minute', { parked: true });
    // On a table this small a sequential scan is the cheaper plan, so it is ruled out here: what is
    // checked is that the query can use the indexes, as it must on a table holding days of sent rows.
    // pg_stat_xact_user_tables has this backend's scans not yet flushed to the statistics, and
    // nothing is flushed inside a transaction: the difference around the call is the call's.
    const scans = await ds.transaction(async (em) => {
      const count = async () => {
        const [row]: { seq_scan: string; idx_scan: string }[] = await em.query(
          `SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'outbox'`,
        );
        return { seq: Number(row.seq_scan), idx: Number(row.idx_scan) };
      };
      await em.query('SET LOCAL enable_seqscan = off');
      const before = await count();
      const figures = await repo.figures(em);
      const after = await count();
      return { figures, seqScan: after.seq - before.seq, idxScan: after.idx - before.idx };
    });
    expect(scans.figures).toMatchObject({ backlog: 1, parked: 1 });
    expect(scans.seqScan).toBe(0);
    expect(scans.idxScan).toBeGreaterThanOrEqual(2);
  });
});
