import { NotificationSender } from '../../apps/relay/src/outbox/notification-sender.interface';
import { OutboxRelayRepository } from '../../apps/relay/src/outbox/outbox-relay.repository';
import { eventually, freePort } from '../support/infra';
import {
  compileRelay,
  insertOutboxRows,
  relayFixture,
  rowByKey,
  sample,
  TOPIC,
  type RelayHarness,
} from './relay-harness';

describe('relay: the webhook contract, a provider that is down, backoff and parking', () => {
  let relay: RelayHarness;
  const { ds, provider } = relayFixture(10, {
    setUp: async () => {
      relay = await compileRelay({
        env: {
          NOTIFY_WEBHOOK_URL: provider.url,
          // Long enough that a loaded machine's slow answer is not a timeout; the hang test waits it out once.
          NOTIFY_TIMEOUT_S: '2',
          OUTBOX_MAX_ATTEMPTS: '3',
          OUTBOX_BACKOFF_BASE_MS: '200',
          OUTBOX_BACKOFF_MAX_MS: '400',
        },
      });
    },
    tearDown: () => relay.close(),
  });

  it('POSTs the row as INTERFACE.md says, with the dedupe key as Idempotency-Key, and records it as sent', async () => {
    const [key] = await insertOutboxRows(ds, 1, 'summary_ready');
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1, failed: 0 });

    expect(provider.deliveries).toHaveLength(1);
    const [d] = provider.deliveries;
    expect(d).toMatchObject({ method: 'POST', path: '/notify', idempotencyKey: key, contentType: 'application/json' });
    expect(Object.keys(d.body)).toEqual(['topic', 'dedupe_key', 'payload']);
    expect(d.body).toEqual({
      topic: TOPIC,
      dedupe_key: key,
      payload: { job_id: 'summary_ready-1', to: 'someone@example.com' },
    });

    const row = await rowByKey(ds, key);
    expect(row).toMatchObject({ attempts: 0, last_error: null, lease_until: null, parked_at: null });
    expect(row.sent_at).toBeInstanceOf(Date);
    // Sent rows are never claimed again.
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveries).toHaveLength(1);
    expect(await sample(relay.registry, 'outbox_sends_total', { outcome: 'sent' })).toBeGreaterThanOrEqual(1);
  });

  it('the rows of one pass are recorded sent through the grouped statement, every row sent once', async () => {
    const keys = await insertOutboxRows(ds, 8, 'crowd');
    const repository = relay.moduleRef.get(OutboxRelayRepository);
    // A pass-through spy: the statement still runs against PostgreSQL.
    const many = jest.spyOn(repository, 'markSentMany');
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 8, sent: 8, failed: 0 });
    // How the rows split into statements depends on when the answers arrive; each row is in exactly one.
    const recorded = many.mock.calls.flatMap(([, rows]) => rows.map((r) => r.id));
    many.mockRestore();
    const ids: { id: string }[] = await ds.query('SELECT id FROM outbox WHERE dedupe_key = ANY($1)', [keys]);
    expect([...recorded].sort()).toEqual(ids.map((r) => String(r.id)).sort());
    for (const key of keys) expect((await rowByKey(ds, key)).sent_at).toBeInstanceOf(Date);
    expect(provider.deliveries.map((d) => d.idempotencyKey).sort()).toEqual([...keys].sort());
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
  });

  it('a grouped statement that fails leaves each of its rows unrecorded, to be sent again after its lease', async () => {
    const keys = await insertOutboxRows(ds, 3, 'unrecorded');
    const repository = relay.moduleRef.get(OutboxRelayRepository);
    // Fault injection around the real repository: the recording statement fails, whatever rows it holds.
    const many = jest.spyOn(repository, 'markSentMany').mockRejectedValue(new Error('connection reset'));
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 3, sent: 0, unrecorded: 3 });
    many.mockRestore();
    expect(provider.deliveries).toHaveLength(3);
    for (const key of keys) {
      const row = await rowByKey(ds, key);
      expect(row).toMatchObject({ sent_at: null, attempts: 0 });
      expect(row.lease_until).toBeInstanceOf(Date);
    }
  });

  it('provider down (503): attempts 1, last_error kept, due later; after the backoff the next pass sends it', async () => {
    // Its own relay with a 60 s backoff step: the first retry waits 30 to 60 s, far longer than this test takes, so
    // "not due yet" cannot come true by the machine being slow; the test then ends the backoff itself.
    const down = await compileRelay({
      env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_BACKOFF_BASE_MS: '60000', OUTBOX_BACKOFF_MAX_MS: '60000' },
    });
    try {
      const [key] = await insertOutboxRows(ds, 1, 'down');
      provider.answer = () => ({ status: 503 });

      // PostgreSQL's clock before the failure: the backoff starts no earlier.
      const [{ before }] = await ds.query<{ before: Date }[]>('SELECT now() AS before');
      await expect(down.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 1, sent: 0 });
      const failed = await rowByKey(ds, key);
      expect(failed).toMatchObject({
        attempts: 1,
        last_error: 'HTTP 503',
        sent_at: null,
        parked_at: null,
        lease_until: null,
      });
      expect(failed.due_in_ms).toBeGreaterThan(0);
      expect(failed.due_in_ms).toBeLessThanOrEqual(60_000);
      // Equal jitter: at least half the capped backoff, counted from a failure no earlier than `before`.
      expect(failed.next_attempt_at.getTime() - before.getTime()).toBeGreaterThanOrEqual(30_000);

      // Not due yet: not claimed, not sent.
      await expect(down.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
      expect(provider.deliveriesFor(key)).toHaveLength(1);

      provider.answer = () => ({ status: 200 });
      // The backoff over: the row is due now.
      await ds.query(`UPDATE outbox SET next_attempt_at = now() WHERE dedupe_key = $1`, [key]);
      await expect(down.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });

      const sent = await rowByKey(ds, key);
      expect(sent.sent_at).toBeInstanceOf(Date);
      expect(sent).toMatchObject({ attempts: 1, last_error: 'HTTP 503', lease_until: null });
      const deliveries = provider.deliveriesFor(key);
      expect(deliveries).toHaveLength(2);
      expect(deliveries[1].rawBody).toBe(deliveries[0].rawBody);
      expect(await sample(down.registry, 'outbox_sends_total', { outcome: 'failed' })).toBe(1);
      expect(await sample(down.registry, 'outbox_sends_total', { outcome: 'sent' })).toBe(1);
    } finally {
      await down.close();
    }
  });

  it('parks a row that always fails after OUTBOX_MAX_ATTEMPTS tries, and never tries it again', async () => {
    const [key] = await insertOutboxRows(ds, 1, 'doomed');
    provider.answer = () => ({ status: 500 });
    const parkedBefore = await sample(relay.registry, 'outbox_sends_total', { outcome: 'parked' });

    await eventually(
      async () => {
        await relay.relay.runOnce();
        const row = await rowByKey(ds, key);
        return row.parked_at ? row : undefined;
      },
      5000,
      'the row to be parked',
    );

    const row = await rowByKey(ds, key);
    expect(row).toMatchObject({ attempts: 3, last_error: 'HTTP 500', sent_at: null, lease_until: null });
    expect(provider.deliveriesFor(key)).toHaveLength(3);

    // Due by its time (as if well past the largest backoff): parked, still never claimed.
    await ds.query(`UPDATE outbox SET next_attempt_at = now() - interval '1 hour' WHERE dedupe_key = $1`, [key]);
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveriesFor(key)).toHaveLength(3);

    expect(await sample(relay.registry, 'outbox_sends_total', { outcome: 'parked' })).toBe(parkedBefore + 1);
    expect(await sample(relay.registry, 'outbox_parked_rows')).toBe(1);
    expect(await sample(relay.registry, 'outbox_backlog_rows')).toBe(0);

    // The re-queue of docs/operations.md puts it back in line, and it goes out with the same key.
    provider.answer = () => ({ status: 200 });
    await ds.query(
      `UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = now(), last_error = NULL WHERE dedupe_key = $1`,
      [key],
    );
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
    expect(provider.deliveriesFor(key)).toHaveLength(4);
    expect(await sample(relay.registry, 'outbox_parked_rows')).toBe(0);
  });

  it('a provider that does not answer in NOTIFY_TIMEOUT_S is a failure with a short last_error; the pass does not wait for it', async () => {
    const [key] = await insertOutboxRows(ds, 1, 'slow');
    // It never answers: only NOTIFY_TIMEOUT_S can end this pass.
    provider.answer = () => 'hang';
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 1 });
    expect(await rowByKey(ds, key)).toMatchObject({
      attempts: 1,
      last_error: 'timeout after 2000 ms',
      lease_until: null,
    });
    expect(provider.deliveriesFor(key)).toHaveLength(1);
  });

  it.each([
    [204, 'sent'],
    [202, 'sent'],
    [302, 'HTTP 302'],
    [404, 'HTTP 404'],
    [429, 'HTTP 429'],
  ])('answer %i: %s', async (status, expected) => {
    const [key] = await insertOutboxRows(ds, 1, `status-${status}`);
    provider.answer = () => ({ status });
    await relay.relay.runOnce();
    const row = await rowByKey(ds, key);
    if (expected === 'sent') expect(row).toMatchObject({ attempts: 0, last_error: null });
    else expect(row).toMatchObject({ attempts: 1, last_error: expected, sent_at: null });
    expect(row.sent_at !== null).toBe(expected === 'sent');
  });

  it.each([
    ['/notify/', '/notify/'],
    ['/notify/?token=s3cret&v=2', '/notify/?token=s3cret&v=2'],
    ['', '/'],
  ])('the webhook URL is posted to as it is given: %j as %j', async (tail, path) => {
    const origin = new URL(provider.url).origin;
    const exact = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: `${origin}${tail}` } });
    try {
      const [key] = await insertOutboxRows(ds, 1, `url-${path.length}`);
      await expect(exact.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
      expect(provider.deliveriesFor(key).map((d) => d.path)).toEqual([path]);
      expect(provider.deliveriesFor(key)[0].userAgent).toBe('llm-workflows-relay');
    } finally {
      await exact.close();
    }
  });

  it("a webhook URL's credentials go as Basic authorization, not in the path", async () => {
    const url = new URL(provider.url);
    url.username = 'relay';
    url.password = 'p@ss:word';
    const withAuth = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: url.toString() } });
    try {
      const [key] = await insertOutboxRows(ds, 1, 'basic');
      await expect(withAuth.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
      const [d] = provider.deliveriesFor(key);
      expect(d.path).toBe('/notify');
      expect(d.authorization).toBe(`Basic ${Buffer.from('relay:p@ss:word').toString('base64')}`);
    } finally {
      await withAuth.close();
    }
  });

  it('a provider that cannot be reached is a failure naming the network error', async () => {
    const unreachable = await compileRelay({
      env: { NOTIFY_WEBHOOK_URL: `http://127.0.0.1:${freePort(11)}/notify`, NOTIFY_TIMEOUT_S: '1' },
    });
    try {
      const [key] = await insertOutboxRows(ds, 1, 'refused');
      await expect(unreachable.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 1 });
      const row = await rowByKey(ds, key);
      expect(row.attempts).toBe(1);
      expect(row.last_error).toMatch(/ECONNREFUSED/);
    } finally {
      await unreachable.close();
    }
  });

  it('a sender that throws (not an HTTP answer) is a failure too, never a crash of the pass', async () => {
    const broken = await compileRelay({
      override: (b) =>
        b.overrideProvider(NotificationSender).useValue({
          send: () => {
            throw new TypeError('boom');
          },
        }),
    });
    try {
      const [key] = await insertOutboxRows(ds, 1, 'throws');
      await expect(broken.relay.runOnce()).resolves.toMatchObject({ claimed: 1, failed: 1 });
      expect(await rowByKey(ds, key)).toMatchObject({ attempts: 1, last_error: 'TypeError: boom' });
    } finally {
      await broken.close();
    }
  });
});
