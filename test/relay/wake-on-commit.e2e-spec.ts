import { summaryReadyDedupeKey, summaryReadyMessage } from '@app/summary-queue';
import { SummaryRepository, SummaryWriter } from '@app/persistence';
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { OutboxListener } from '../../apps/relay/src/outbox/outbox-listener';
import {
  OUTBOX_RELAY_OPTIONS,
  type OutboxRelayOptions,
} from '../../apps/relay/src/outbox/outbox-relay.module-definition';
import { eventually, freePort, testDatabaseUrl, testDataSource, truncateAll } from '../support/infra';
import { TcpProxy } from '../support/tcp-proxy';
import { FakeProvider, insertOutboxRows, startRelay, type RelayHarness } from './relay-harness';

/**
 * OUTBOX_POLL_MS is an hour here: any row delivered while a test runs was
 * woken by its commit (or by the LISTEN connection coming back), never by
 * polling. The tests wait for deliveries with a bound far past the time one
 * takes (WAKE_BOUND_MS): a bound on the test, not a claim about speed.
 */
const POLL_MS = '3600000';
const WAKE_BOUND_MS = 20_000;

/**
 * Until the relay's loop sits in its hour-long idle wait, not woken: the passes at start-up (the first, and the one
 * the LISTEN connection's onListening asks for) are over, and only a wake starts another. Read from OutboxRelay's
 * own state (`idling`, private: the abort controller of the wait in progress), which nothing public shows.
 */
const idle = (harness: RelayHarness) =>
  eventually(
    () => {
      const idling = (harness.relay as unknown as { idling?: AbortController }).idling;
      return idling !== undefined && !idling.signal.aborted ? true : undefined;
    },
    5000,
    'the relay loop idle',
  );

describe('relay: woken by the commit, LISTEN reconnects, health', () => {
  let ds: DataSource;
  let writer: SummaryWriter;
  let provider: FakeProvider;
  let relay: RelayHarness & { app: NonNullable<RelayHarness['app']> };
  let server: Server;

  /** The worker's transaction: the summary and its outbox row, NOTIFY at commit. Resolves at commit. */
  const commitSummary = async () => {
    const jobId = randomUUID();
    await expect(
      writer.writeWithNotification(
        { jobId, tenant: 'acme', summary: 'Short.' },
        summaryReadyMessage(jobId, 'ops@example.com'),
      ),
    ).resolves.toBe('done');
    return summaryReadyDedupeKey(jobId);
  };
  const deliveredWithin = (key: string, ms: number) =>
    eventually(() => (provider.deliveriesFor(key).length > 0 ? true : undefined), ms, `a delivery of ${key}`);

  beforeAll(async () => {
    ds = await testDataSource();
    await truncateAll(ds);
    writer = new SummaryWriter(ds, new SummaryRepository());
    provider = await FakeProvider.start(freePort(50));
    relay = await startRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_POLL_MS: POLL_MS } });
    server = relay.app.getHttpServer() as Server;
    await eventually(() => (relay.listener.listening ? true : undefined), 5000, 'the LISTEN connection');
    // The start-up passes found nothing; the loop now sleeps for an hour unless woken.
    await idle(relay);
  });
  afterAll(async () => {
    await relay.close();
    await provider.close();
    await ds.destroy();
  });

  it('delivers a row committed through SummaryWriter without waiting for the poll interval', async () => {
    const key = await commitSummary();
    await deliveredWithin(key, WAKE_BOUND_MS);
    expect(provider.deliveriesFor(key)).toHaveLength(1);
    await eventually(
      async () => {
        const [row] = await ds.query('SELECT sent_at FROM outbox WHERE dedupe_key = $1', [key]);
        return row.sent_at ? true : undefined;
      },
      WAKE_BOUND_MS,
      'the row recorded as sent',
    );
  });

  it('is live and ready, with the LISTEN connection among the readiness checks', async () => {
    await request(server).get('/health/live').expect(200);
    const ready = await request(server).get('/health/ready').expect(200);
    expect(ready.body.details).toMatchObject({ postgres: { status: 'up' }, outbox_listen: { status: 'up' } });
    // The relay's own list, and nothing else: no Redis.
    expect(Object.keys(ready.body.details).sort()).toEqual(['outbox_listen', 'postgres']);
  });

  it('re-establishes a killed LISTEN connection; commits during and after the outage are still delivered promptly', async () => {
    const oldPid = relay.listener.backendPid;
    expect(oldPid).toEqual(expect.any(Number));
    await ds.query('SELECT pg_terminate_backend($1)', [oldPid]);

    // Committed while the listener is (probably) down: the pass after reconnecting finds it.
    const during = await commitSummary();
    await deliveredWithin(during, WAKE_BOUND_MS);

    await eventually(
      () => {
        const pid = relay.listener.backendPid;
        return pid !== undefined && pid !== oldPid ? pid : undefined;
      },
      5000,
      'a new LISTEN connection',
    );
    await request(server).get('/health/ready').expect(200);

    const after = await commitSummary();
    await deliveredWithin(after, WAKE_BOUND_MS);
    expect(provider.deliveriesFor(during)).toHaveLength(1);
    expect(provider.deliveriesFor(after)).toHaveLength(1);
  });

  it('coalesces a burst of notifications: 200 rows in one commit take a handful of passes, not 200', async () => {
    const passes = jest.spyOn(relay.relay, 'runOnce');
    try {
      const keys = await insertOutboxRows(ds, 200, 'burst');
      await eventually(
        () => (keys.every((k) => provider.deliveriesFor(k).length === 1) ? true : undefined),
        5000,
        'all 200 delivered',
      );
      // 10 full batches of 20, drained back to back, plus at most a few passes for notifications that came in
      // meanwhile.
      expect(passes.mock.calls.length).toBeGreaterThanOrEqual(10);
      expect(passes.mock.calls.length).toBeLessThan(30);
      expect(provider.countsByKey().size).toBe(provider.deliveries.length);
    } finally {
      passes.mockRestore();
    }
  });

  it('fails readiness, naming the check, when there is no LISTEN connection', async () => {
    await relay.listener.stop();
    const res = await request(server).get('/health/ready').expect(503);
    expect(res.body.failing).toEqual(['outbox_listen']);
    // Liveness looks at the loop only, which still turns.
    await request(server).get('/health/live').expect(200);
  });
});

/**
 * Only the LISTEN connection goes through a proxy that can hang it; the
 * relay's queries use the pool directly. OUTBOX_POLL_MS is an hour, as above.
 */
describe('relay: a LISTEN connection that hangs without closing', () => {
  let ds: DataSource;
  let provider: FakeProvider;
  let proxy: TcpProxy;
  let relay: RelayHarness & { app: NonNullable<RelayHarness['app']> };
  let server: Server;
  const deliveredWithin = (key: string, ms: number) =>
    eventually(() => (provider.deliveriesFor(key).length > 0 ? true : undefined), ms, `a delivery of ${key}`);

  beforeAll(async () => {
    ds = await testDataSource();
    await truncateAll(ds);
    provider = await FakeProvider.start(freePort(51));
    proxy = await TcpProxy.start(freePort(52), testDatabaseUrl());
    relay = await startRelay({
      env: { NOTIFY_WEBHOOK_URL: provider.url, OUTBOX_POLL_MS: POLL_MS },
      override: (b) =>
        b.overrideProvider(OutboxListener).useFactory({
          factory: (options: OutboxRelayOptions) =>
            new OutboxListener({ ...options, databaseUrl: proxy.urlFor(options.databaseUrl) }),
          inject: [OUTBOX_RELAY_OPTIONS],
        }),
    });
    server = relay.app.getHttpServer() as Server;
    await eventually(() => (relay.listener.listening ? true : undefined), 5000, 'the LISTEN connection');
    await idle(relay);
  });
  afterAll(async () => {
    await relay.close();
    await proxy.close();
    await provider.close();
    await ds.destroy();
  });

  it('a readiness check finds it silent and replaces it; the rows committed meanwhile and later are delivered promptly', async () => {
    const oldPid = relay.listener.backendPid;
    expect(oldPid).toEqual(expect.any(Number));
    expect(proxy.freezeOpenConnections()).toBe(1);
    // Its notification is stuck in the hung connection: only a new LISTEN finds the row.
    const [during] = await insertOutboxRows(ds, 1, 'hung');

    // The probe (every 5 s in Kubernetes) fails on the silent connection, and the listener replaces it.
    const probe = await request(server).get('/health/ready').expect(503);
    expect(probe.body.failing).toEqual(['outbox_listen']);
    await eventually(
      () => {
        const pid = relay.listener.backendPid;
        return pid !== undefined && pid !== oldPid ? pid : undefined;
      },
      5000,
      'a new LISTEN connection',
    );
    await deliveredWithin(during, WAKE_BOUND_MS);
    await request(server).get('/health/ready').expect(200);

    const [after] = await insertOutboxRows(ds, 1, 'after');
    await deliveredWithin(after, WAKE_BOUND_MS);
    expect(provider.deliveriesFor(during)).toHaveLength(1);
    expect(provider.deliveriesFor(after)).toHaveLength(1);
  });
});
