import { SummaryRepository, SummaryWriter, summaryReadyDedupeKey } from '@app/persistence';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { freePort, testDataSource, truncateAll } from '../support/infra';
import { compileRelay, FakeProvider, type RelayHarness } from './relay-harness';

/**
 * The relay's half of the worker's crash test (issue 3: commit, then crash
 * before XACK, then redelivery): the redelivered job's transaction finds the
 * summary stored and writes no second outbox row, so relay passes after both
 * deliveries make exactly one webhook delivery.
 */
describe('relay: a job delivered twice by the stream is notified once', () => {
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

  it('one webhook delivery for a job whose transaction ran twice', async () => {
    const writer = new SummaryWriter(ds, new SummaryRepository());
    const jobId = randomUUID();
    const done = { jobId, tenant: 'acme', summary: 'Short.', notify: 'ops@example.com' };
    await expect(writer.writeWithNotification(done)).resolves.toBe('done');
    // Worker A dies before XACK; worker B gets the job again and runs it to the end.
    await expect(writer.writeWithNotification({ ...done, summary: 'Second run.' })).resolves.toBe('duplicate');

    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 1, sent: 1 });
    await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 0 });
    expect(provider.deliveries).toHaveLength(1);
    expect(provider.deliveries[0].idempotencyKey).toBe(summaryReadyDedupeKey(jobId));
    expect(provider.deliveries[0].body).toEqual({
      topic: 'email.summary_ready',
      dedupe_key: summaryReadyDedupeKey(jobId),
      payload: { job_id: jobId, to: 'ops@example.com' },
    });
  });
});
