import { SpanStatusCode } from '@opentelemetry/api';
import { JOBS_STREAM, jobIdFor, SummaryJobQueue } from '@app/summary-queue';
import { useInMemoryTracing } from '@app/tracing/in-memory-tracing';
import { randomUUID } from 'node:crypto';
import { compileRelay, FakeProvider, insertOutboxRows } from '../relay/relay-harness';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freePort, freshRedis, testDataSource, truncateAll } from '../support/infra';
import { startWorker } from '../support/worker-harness';

/*
 * A send or a delivery that fails without throwing (the relay records a failed
 * send and retries it later; the consumer leaves an entry for redelivery or
 * dead-letters it) ends its span as an error, so that a trace view and tail
 * sampling see it fail. In process, with tracing on as the SDK turns it on,
 * exported to memory.
 */
describe('the status of a send span and a delivery span', () => {
  const exporter = useInMemoryTracing();
  const statusOf = (name: string) =>
    exporter
      .getFinishedSpans()
      .filter((s) => s.name === name)
      .map((s) => ({ outcome: s.attributes.outcome, status: s.status.code }));

  it("the relay's: an error for a send that failed, unset for one sent", async () => {
    const ds = await testDataSource();
    const webhook = await FakeProvider.start(freePort(97));
    const relay = await compileRelay({ env: { NOTIFY_WEBHOOK_URL: webhook.url } });
    try {
      await truncateAll(ds);
      const [ok, bad] = await insertOutboxRows(ds, 2, `span-${randomUUID()}`, false);
      webhook.answer = (d) => ({ status: d.idempotencyKey === bad ? 500 : 200 });
      await expect(relay.relay.runOnce()).resolves.toMatchObject({ claimed: 2, sent: 1, failed: 1 });
      expect(webhook.deliveries.map((d) => d.idempotencyKey).sort()).toEqual([ok, bad].sort());
      expect(statusOf('deliver outbox').sort((a, b) => String(a.outcome).localeCompare(String(b.outcome)))).toEqual([
        { outcome: 'failed', status: SpanStatusCode.ERROR },
        { outcome: 'sent', status: SpanStatusCode.UNSET },
      ]);
    } finally {
      await relay.close();
      await webhook.close();
      await ds.destroy();
    }
  });

  it("the worker's: an error for an entry dead-lettered, unset for a job done", async () => {
    const redis = await freshRedis();
    const model = await new FakeOpenAiServer().start();
    const w = await startWorker({ modelUrl: model.baseUrl });
    try {
      await new SummaryJobQueue(redis).enqueue({
        jobId: jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`),
        tenant: 'tenant-a',
        payload: { text: 'Traced.', notify: 'a@example.com' },
      });
      // No tenant, no payload: malformed, dead-lettered at once.
      await redis.xadd(JOBS_STREAM, '*', 'job_id', randomUUID());
      const outcomes = (await w.consumer.runOnce()).map((d) => d.outcome).sort();
      expect(outcomes).toEqual(['dead_lettered', 'done']);
      expect(
        statusOf(`process ${JOBS_STREAM}`).sort((a, b) => String(a.outcome).localeCompare(String(b.outcome))),
      ).toEqual([
        { outcome: 'dead_lettered', status: SpanStatusCode.ERROR },
        { outcome: 'done', status: SpanStatusCode.UNSET },
      ]);
    } finally {
      await w.close();
      await model.stop();
      redis.disconnect();
    }
  });
});
