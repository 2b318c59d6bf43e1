import { NotificationSender, type OutboxMessage } from '../../apps/relay/src/outbox/notification-sender.interface';
import { OutboxRelayRepository } from '../../apps/relay/src/outbox/outbox-relay.repository';
import { WebhookSender } from '../../apps/relay/src/outbox/webhook.sender';
import { eventually } from '../support/infra';
import { compileRelay, insertOutboxRows, relayFixture, rowByKey, sample, type RelayHarness } from './relay-harness';

/** A sender that runs `after` once the real webhook call has come back, before the relay records anything. */
function webhookThen(url: string, after: () => Promise<void>): NotificationSender {
  const real = new WebhookSender(url);
  return {
    async send(message: OutboxMessage, signal: AbortSignal) {
      try {
        await real.send(message, signal);
      } finally {
        await after();
      }
    },
  };
}

describe('relay: a crash between sending and recording, and lease ownership', () => {
  // A send may take as long as a loaded machine makes it (NOTIFY_TIMEOUT_S 10: a lease of 21 s). No test waits a
  // lease out: where one must have passed, the test moves it into the past, as a pause that long would.
  const env = { NOTIFY_TIMEOUT_S: '10' };
  let relayB: RelayHarness;
  const { ds, provider } = relayFixture(20, {
    setUp: async () => {
      relayB = await compileRelay({ env: { ...env, NOTIFY_WEBHOOK_URL: provider.url } });
    },
    tearDown: () => relayB.close(),
  });

  it('sends again with the same Idempotency-Key once the dead relay’s lease expires, and only then records it as sent', async () => {
    const [key] = await insertOutboxRows(ds, 1, 'crash');
    // Relay A: the provider accepts the send, then the process dies before its UPDATE (its connections are gone).
    const relayA: RelayHarness = await compileRelay({
      env,
      override: (b) =>
        b
          .overrideProvider(NotificationSender)
          .useValue(webhookThen(provider.url, async () => relayA.dataSource.destroy())),
    });
    try {
      await expect(relayA.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 0, unrecorded: 1 });
    } finally {
      await relayA.close();
    }
    expect(provider.deliveriesFor(key)).toHaveLength(1);
    const orphan = await rowByKey(ds, key);
    expect(orphan).toMatchObject({ sent_at: null, attempts: 0 });
    expect(orphan.lease_until).toBeInstanceOf(Date);

    // While A's lease runs, nobody sends it again.
    await expect(relayB.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveriesFor(key)).toHaveLength(1);

    // After it: relay B claims it and sends it again, with the same key and body.
    await ds.query(`UPDATE outbox SET lease_until = now() - interval '1 second' WHERE dedupe_key = $1`, [key]);
    await expect(relayB.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });

    const deliveries = provider.deliveriesFor(key);
    expect(deliveries).toHaveLength(2);
    expect(deliveries.map((d) => d.idempotencyKey)).toEqual([key, key]);
    expect(deliveries[1].rawBody).toBe(deliveries[0].rawBody);
    const row = await rowByKey(ds, key);
    expect(row.sent_at).toBeInstanceOf(Date);
    expect(row).toMatchObject({ attempts: 0, lease_until: null });
    // Recorded once: further passes send nothing.
    await expect(relayB.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveries).toHaveLength(2);
  });

  it('a relay whose lease was taken over cannot overwrite the new holder’s result', async () => {
    const [key] = await insertOutboxRows(ds, 1, 'stale');
    provider.answer = () => ({ status: 503 });
    // Relay A's send fails, and before it records that, its lease passes (a long pause) and relay B
    // claims the row, tries it and records its own failure.
    const relayA = await compileRelay({
      env,
      override: (b) =>
        b.overrideProvider(NotificationSender).useValue(
          webhookThen(provider.url, async () => {
            await ds.query(`UPDATE outbox SET lease_until = now() - interval '1 second' WHERE dedupe_key = $1`, [key]);
            await expect(relayB.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 1 });
          }),
        ),
    });
    try {
      await expect(relayA.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 0, leaseLost: 1 });
      expect(await sample(relayA.registry, 'outbox_lease_lost_total')).toBe(1);
    } finally {
      await relayA.close();
    }
    // B's result stands: one failure counted, not two (A's late failure would have made it 2).
    expect(await rowByKey(ds, key)).toMatchObject({
      attempts: 1,
      last_error: 'HTTP 503',
      lease_until: null,
      parked_at: null,
    });
    expect(provider.deliveriesFor(key)).toHaveLength(2);
  });

  it('fences every write on the lease value: the stale holder is refused while the new one holds it', async () => {
    const repo = new OutboxRelayRepository();
    const [key] = await insertOutboxRows(ds, 1, 'fence');
    const [a] = await repo.claim(ds.manager, 10, 60_000, 10, false);
    // Not claimable while leased.
    await expect(repo.claim(ds.manager, 10, 60_000, 10, false)).resolves.toEqual([]);
    // A's lease runs out (moved into the past, as a long pause would), and another claim takes the row: a longer
    // lease, so never the same value as A's.
    await ds.query(`UPDATE outbox SET lease_until = now() - interval '1 second' WHERE dedupe_key = $1`, [key]);
    const [b] = await repo.claim(ds.manager, 10, 120_000, 10, false);
    expect(b.id).toBe(a.id);
    expect(b.lease.getTime()).toBeGreaterThan(a.lease.getTime());

    await expect(repo.markSent(ds.manager, a.id, a.lease)).resolves.toBe(false);
    await expect(repo.markFailed(ds.manager, a.id, a.lease, 'HTTP 500', 1000)).resolves.toBe(false);
    await expect(repo.park(ds.manager, a.id, a.lease, 'HTTP 500')).resolves.toBe(false);
    const held = await rowByKey(ds, key);
    expect(held).toMatchObject({ attempts: 0, sent_at: null, parked_at: null, last_error: null });
    expect(held.lease_until?.getTime()).toBe(b.lease.getTime());

    await expect(repo.markSent(ds.manager, b.id, b.lease)).resolves.toBe(true);
    expect((await rowByKey(ds, key)).sent_at).toBeInstanceOf(Date);
  });

  it('markSentMany fences each row on its own lease: one statement, the stale row refused, the rest recorded', async () => {
    const repo = new OutboxRelayRepository();
    const keys = await insertOutboxRows(ds, 3, 'many');
    const claimed = await repo.claim(ds.manager, 10, 60_000, 10, false);
    expect(claimed).toHaveLength(3);
    const stale = { id: claimed[1].id, lease: new Date(claimed[1].lease.getTime() - 1) };
    await expect(
      repo.markSentMany(
        ds.manager,
        [claimed[0], stale, claimed[2]].map(({ id, lease }) => ({ id, lease })),
      ),
    ).resolves.toEqual([true, false, true]);
    const rows = await Promise.all(keys.map((k) => rowByKey(ds, k)));
    expect(rows.map((r) => r.sent_at instanceof Date)).toEqual([true, false, true]);
    expect(rows[1].lease_until?.getTime()).toBe(claimed[1].lease.getTime());
  });

  it('an expired lease nobody took over still records: no needless second send', async () => {
    const repo = new OutboxRelayRepository();
    const [key] = await insertOutboxRows(ds, 1, 'late');
    const [a] = await repo.claim(ds.manager, 10, 50, 10, false);
    // The lease runs out by PostgreSQL's clock, the one claims judge it by (moving it would change the fence value).
    await eventually(
      async () => {
        const [row] = await ds.query<{ expired: boolean }[]>(
          'SELECT lease_until < now() AS expired FROM outbox WHERE dedupe_key = $1',
          [key],
        );
        return row.expired ? true : undefined;
      },
      5000,
      'the lease to run out',
    );
    await expect(repo.markSent(ds.manager, a.id, a.lease)).resolves.toBe(true);
    expect((await rowByKey(ds, key)).sent_at).toBeInstanceOf(Date);
  });
});
