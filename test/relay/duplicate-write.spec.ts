import { SUMMARY_READY_TOPIC, summaryReadyDedupeKey, summaryReadyMessage } from '@app/summary-queue';
import { SummaryRepository, SummaryWriter } from '@app/persistence';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { freePort, testDataSource, truncateAll } from '../support/infra';
import { compileRelay, FakeProvider, type RelayHarness } from './relay-harness';

/**
 * SummaryWriter and the relay, without the stream or the handler: when a
 * job's write runs twice (a worker committed and died before XACK, and the
 * redelivery ran it again), the second write adds no outbox row, so the relay
 * sends one webhook. The same crash through api, stream, worker and relay is
 * test/e2e/whole-chain.e2e-spec.ts; this is its fast check in the relay suite.
 */
describe('relay: a job whose write ran twice is sent once', () => {
  let ds: DataSource;
  let provider: FakeProvider;
  let relay: RelayHarness;

  beforeAll(async () => {
    ds = await testDataSource();
    await truncateAll(ds);
    provider = await FakeProvider.start(freePort(90));
    relay = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: provider.url } });
  });
  afterAll(async () => {
    await relay.close();
    await provider.close();
    await ds.destroy();
  });

  it('SummaryWriter twice for one job, then relay passes: exactly one webhook delivery for the job', async () => {
    const writer = new SummaryWriter(ds, new SummaryRepository());
    const jobId = randomUUID();
    const done = { jobId, tenant: 'acme', summary: 'Short.' };
    const message = summaryReadyMessage(jobId, 'ops@example.com');
    await expect(writer.writeWithNotification(done, message)).resolves.toBe('done');
    // The same job written again, as its redelivery does after a worker died between commit and XACK.
    await expect(writer.writeWithNotification({ ...done, summary: 'Second run.' }, message)).resolves.toBe('duplicate');

    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveries).toHaveLength(1);
    expect(provider.deliveries[0].idempotencyKey).toBe(summaryReadyDedupeKey(jobId));
    expect(provider.deliveries[0].body).toEqual({
      topic: SUMMARY_READY_TOPIC,
      dedupe_key: summaryReadyDedupeKey(jobId),
      payload: { job_id: jobId, to: 'ops@example.com' },
    });
  });
});
