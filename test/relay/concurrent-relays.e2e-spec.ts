import { Client } from 'pg';
import type { RelayPassResult } from '../../apps/relay/src/outbox/outbox.relay';
import { eventually, testDatabaseUrl } from '../support/infra';
import { compileRelay, insertOutboxRows, relayFixture, sample, startRelay, type RelayHarness } from './relay-harness';

describe('relay: several relays side by side', () => {
  const { ds, provider } = relayFixture(30);

  it('four relays drain 1,000 rows committed at once: every row delivered exactly once, none left', async () => {
    const relays: RelayHarness[] = [];
    try {
      for (let i = 0; i < 4; i++) {
        relays.push(await startRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_POLL_MS: '200' } }));
      }
      await eventually(() => (relays.every((r) => r.listener.listening) ? true : undefined), 5000, 'four listeners');

      const keys = await insertOutboxRows(ds, 1000, 'drain');
      await eventually(
        async () => {
          const [{ n }] = await ds.query('SELECT count(*)::int AS n FROM outbox WHERE sent_at IS NULL');
          return n === 0 ? true : undefined;
        },
        20_000,
        'all rows sent',
      );

      const counts = provider.countsByKey();
      expect(provider.deliveries).toHaveLength(1000);
      expect(counts.size).toBe(1000);
      expect([...counts.values()].every((n) => n === 1)).toBe(true);
      expect([...counts.keys()].sort()).toEqual([...keys].sort());
      expect(
        await ds.query(
          'SELECT count(*)::int AS n FROM outbox WHERE attempts > 0 OR parked_at IS NOT NULL OR lease_until IS NOT NULL',
        ),
      ).toEqual([{ n: 0 }]);
      // Each row recorded as sent by exactly one relay; the work was shared.
      const perRelay = await Promise.all(
        relays.map((r) => sample(r.registry, 'outbox_sends_total', { outcome: 'sent' })),
      );
      expect(perRelay.reduce((a, b) => a + b, 0)).toBe(1000);
      expect(perRelay.filter((n) => n > 0).length).toBeGreaterThan(1);
    } finally {
      await Promise.all(relays.map((r) => r.close()));
    }
  });

  it('a slow provider holds no row locks: while relay A waits on its sends, relay B claims and sends other rows', async () => {
    const env = { NOTIFY_WEBHOOK_URL: provider.url, NOTIFY_TIMEOUT_S: '5', OUTBOX_BATCH: '5' };
    const a = await compileRelay({ env });
    const b = await compileRelay({ env });
    try {
      await insertOutboxRows(ds, 10, 'slow', false);
      // A's sends are held until the test lets them go; B's are answered at once.
      let answerA!: () => void;
      const heldA = new Promise<void>((resolve) => (answerA = resolve));
      let received = 0;
      provider.answer = () => (++received <= 5 ? { status: 200, after: heldA } : { status: 200 });

      const passA = a.relay.runOnce();
      await eventually(() => (provider.deliveries.length === 5 ? true : undefined), 5000, 'relay A’s five sends');
      const keysA = provider.deliveries.map((d) => d.idempotencyKey);

      // A's rows are not locked while it waits: a NOWAIT lock on them succeeds at once.
      await ds
        .transaction(async (em) => {
          const locked: unknown[] = await em.query(
            `SELECT id FROM outbox WHERE dedupe_key = ANY($1) FOR UPDATE NOWAIT`,
            [keysA],
          );
          expect(locked).toHaveLength(5);
          throw new RollbackOnPurpose();
        })
        .catch((err: unknown) => {
          if (!(err instanceof RollbackOnPurpose)) throw err;
        });

      const passB = b.relay.runOnce();
      await eventually(() => (provider.deliveries.length === 10 ? true : undefined), 5000, 'relay B’s five sends');
      const keysB = provider.deliveries.slice(5).map((d) => d.idempotencyKey);
      expect(keysB.filter((k) => keysA.includes(k))).toEqual([]);
      // B claimed and sent while every send of A still waited for its answer.
      expect(provider.deliveries.slice(0, 5).map((d) => d.answeredAt)).toEqual(Array(5).fill(undefined));
      await expect(passB).resolves.toMatchObject({ claimed: 5, sent: 5 });
      answerA();

      await expect(passA).resolves.toMatchObject({ claimed: 5, sent: 5 });
      expect(await ds.query('SELECT count(*)::int AS n FROM outbox WHERE sent_at IS NOT NULL')).toEqual([{ n: 10 }]);
      expect(provider.countsByKey().size).toBe(10);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it('skips rows another relay has locked mid-claim: the claim takes the later rows instead of waiting', async () => {
    const relay = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url } });
    // Another relay's claim caught between locking its rows and committing: an open transaction,
    // on its own connection, holding row locks on the first two due rows.
    const holder = new Client({ connectionString: testDatabaseUrl(), application_name: 'test-lock-holder' });
    await holder.connect();
    let pass: Promise<RelayPassResult> | undefined;
    try {
      const keys = await insertOutboxRows(ds, 5, 'locked', false);
      await holder.query('BEGIN');
      await holder.query('SELECT id FROM outbox WHERE dedupe_key = ANY($1) FOR UPDATE', [keys.slice(0, 2)]);

      // Without SKIP LOCKED the claim waits until the holder's transaction ends; the bound makes
      // that a failure instead of a hang (it is generous: this asserts what is claimed, not speed).
      pass = relay.relay.runOnce();
      await expect(settlesWithin(pass, 10_000, 'the claim next to locked rows')).resolves.toMatchObject({
        claimed: 3,
        sent: 3,
      });
      expect([...provider.countsByKey()].sort()).toEqual(keys.slice(2).map((k) => [k, 1]));

      // Once the other claim is gone (rolled back here), its rows are claimable again.
      await holder.query('ROLLBACK');
      await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 2, sent: 2 });
      expect([...provider.countsByKey()].sort()).toEqual(keys.map((k) => [k, 1]));
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined);
      await holder.end();
      await pass?.catch(() => undefined); // a claim that waited finishes once the locks are released
      await relay.close();
    }
  });
});

/** `promise`, or a rejection naming `what` if it has not settled after `ms`. */
function settlesWithin<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} still pending after ${ms} ms (blocked on a lock?)`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

class RollbackOnPurpose extends Error {}
