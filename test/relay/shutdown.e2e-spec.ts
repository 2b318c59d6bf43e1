import { eventually } from '../support/infra';
import { insertOutboxRows, relayFixture, rowByKey, startRelay } from './relay-harness';

describe('relay: shutdown (app.close(), as SIGTERM runs it)', () => {
  const { ds, provider } = relayFixture(60);

  it('lets an in-flight slow send finish and records it as sent; claims nothing new meanwhile', async () => {
    const relay = await startRelay({
      env: { NOTIFY_WEBHOOK_URL: provider.url, NOTIFY_TIMEOUT_S: '5', OUTBOX_POLL_MS: '100' },
    });
    await eventually(() => (relay.listener.listening ? true : undefined), 5000, 'the LISTEN connection');
    provider.answer = () => ({ status: 200, delayMs: 1500 });
    const [inflight] = await insertOutboxRows(ds, 1, 'inflight');
    await eventually(
      () => (provider.deliveriesFor(inflight).length === 1 ? true : undefined),
      2000,
      'the send to start',
    );

    // A pass-through spy: the relay claims nothing new from when its shutdown hook begins.
    const stopping = jest.spyOn(relay.relay, 'beforeApplicationShutdown');
    const closing = relay.close();
    await eventually(() => (stopping.mock.calls.length > 0 ? true : undefined), 5000, 'the relay to begin stopping');
    // Committed (and notified) during the shutdown: left for the next relay.
    const [late] = await insertOutboxRows(ds, 1, 'late');
    await closing;

    const delivery = provider.deliveriesFor(inflight)[0];
    expect(delivery.answeredAt).toBeDefined();
    const sent = await rowByKey(ds, inflight);
    expect(sent.sent_at).toBeInstanceOf(Date);
    expect(sent).toMatchObject({ attempts: 0, lease_until: null });

    expect(await rowByKey(ds, late)).toMatchObject({ sent_at: null, lease_until: null, attempts: 0 });
    expect(provider.deliveriesFor(late)).toHaveLength(0);
  });

  it('a send still hanging at shutdown is cut off at NOTIFY_TIMEOUT_S and recorded as a failure', async () => {
    const relay = await startRelay({
      env: { NOTIFY_WEBHOOK_URL: provider.url, NOTIFY_TIMEOUT_S: '0.5', OUTBOX_POLL_MS: '100' },
    });
    provider.answer = () => 'hang';
    const [key] = await insertOutboxRows(ds, 1, 'hangs');
    await eventually(() => (provider.deliveriesFor(key).length === 1 ? true : undefined), 3000, 'the send to start');

    // The provider never answers: only NOTIFY_TIMEOUT_S can let the close finish.
    await relay.close();
    const row = await rowByKey(ds, key);
    expect(row).toMatchObject({ attempts: 1, last_error: 'timeout after 500 ms', sent_at: null, lease_until: null });
  });
});
