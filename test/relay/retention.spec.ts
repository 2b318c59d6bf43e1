import { eventually } from '../support/infra';
import { compileRelay, insertOutboxRows, relayFixture, startRelay, type RelayHarness } from './relay-harness';

describe('relay: retention of sent rows', () => {
  let relay: RelayHarness;
  const { ds, provider } = relayFixture(80, {
    setUp: async () => {
      relay = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_RETENTION_DAYS: '7' } });
    },
    tearDown: () => relay.close(),
  });
  const keysLeft = async () =>
    (await ds.query<{ dedupe_key: string }[]>('SELECT dedupe_key FROM outbox ORDER BY dedupe_key')).map(
      (r) => r.dedupe_key,
    );

  it('deletes only sent rows older than OUTBOX_RETENTION_DAYS, in batches, and keeps unsent and parked rows of any age', async () => {
    // More than two batches of 500.
    await insertOutboxRows(ds, 1050, 'old-sent', false);
    await ds.query(`UPDATE outbox SET created_at = now() - interval '9 days', sent_at = now() - interval '8 days'`);
    await insertOutboxRows(ds, 1, 'recent-sent', false);
    await ds.query(
      `UPDATE outbox SET created_at = now() - interval '7 days', sent_at = now() - interval '6 days' WHERE dedupe_key LIKE 'recent-sent:%'`,
    );
    await insertOutboxRows(ds, 1, 'just-sent', false);
    await ds.query(`UPDATE outbox SET sent_at = now() WHERE dedupe_key LIKE 'just-sent:%'`);
    await insertOutboxRows(ds, 1, 'old-unsent', false);
    await ds.query(
      `UPDATE outbox SET created_at = now() - interval '30 days', attempts = 2 WHERE dedupe_key LIKE 'old-unsent:%'`,
    );
    await insertOutboxRows(ds, 1, 'old-parked', false);
    await ds.query(
      `UPDATE outbox SET created_at = now() - interval '30 days', parked_at = now() - interval '29 days', attempts = 10
        WHERE dedupe_key LIKE 'old-parked:%'`,
    );

    await expect(relay.relay.purgeSent()).resolves.toBe(1050);
    expect(await keysLeft()).toEqual(['just-sent:1', 'old-parked:1', 'old-unsent:1', 'recent-sent:1']);
    await expect(relay.relay.purgeSent()).resolves.toBe(0);
    expect(provider.deliveries).toHaveLength(0);
  });

  it('runs when the relay starts, and parks rows that ran out of attempts under a lowered OUTBOX_MAX_ATTEMPTS', async () => {
    await insertOutboxRows(ds, 3, 'stale', false);
    await ds.query(`UPDATE outbox SET sent_at = now() - interval '8 days'`);
    await insertOutboxRows(ds, 1, 'exhausted', false);
    await ds.query(`UPDATE outbox SET attempts = 5, last_error = 'HTTP 500' WHERE dedupe_key = 'exhausted:1'`);

    const started = await startRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_MAX_ATTEMPTS: '3' } });
    try {
      await eventually(async () => ((await keysLeft()).length === 1 ? true : undefined), 5000, 'retention at start');
      await eventually(
        async () => {
          const [row] = await ds.query(`SELECT parked_at FROM outbox WHERE dedupe_key = 'exhausted:1'`);
          return row.parked_at ? true : undefined;
        },
        5000,
        'the exhausted row to be parked',
      );
    } finally {
      await started.close();
    }
    expect(provider.deliveries).toHaveLength(0);
  });
});
