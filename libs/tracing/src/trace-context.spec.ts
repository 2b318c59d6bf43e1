import { useInMemoryTracing } from './in-memory-tracing';
import { activeTraceparent, inSpan, inSpanFrom, SpanKind } from './trace-context';

const QUEUED = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

describe('trace context across a queue, tracing off (the SDK not started)', () => {
  it('has no traceparent to write, and runs the work as it is, without a span', async () => {
    expect(activeTraceparent()).toBeUndefined();
    await expect(inSpanFrom(QUEUED, 'deliver', {}, async () => activeTraceparent())).resolves.toBeUndefined();
    await expect(inSpan('step', {}, async (span) => span ?? 42)).resolves.toBe(42);
  });
});

describe('trace context across a queue, tracing on', () => {
  const exporter = useInMemoryTracing();

  it('a delivery continues the trace it was queued with, whatever is active; what it queues continues it', async () => {
    const written = await inSpan('unrelated', {}, () =>
      inSpanFrom(QUEUED, 'process jobs', { kind: SpanKind.CONSUMER }, () =>
        inSpan('step', {}, async () => activeTraceparent()),
      ),
    );
    const [step, delivery, unrelated] = exporter.getFinishedSpans();
    expect(delivery.spanContext().traceId).toBe('0af7651916cd43dd8448eb211c80319c');
    expect(delivery.parentSpanContext?.spanId).toBe('b7ad6b7169203331');
    expect(delivery.kind).toBe(SpanKind.CONSUMER);
    expect(unrelated.spanContext().traceId).not.toBe(delivery.spanContext().traceId);
    expect(step.parentSpanContext?.spanId).toBe(delivery.spanContext().spanId);
    expect(written).toBe(`00-${step.spanContext().traceId}-${step.spanContext().spanId}-01`);
  });

  it('without a traceparent a delivery starts a trace; a failure ends its span as an error and is thrown', async () => {
    await expect(
      inSpanFrom(undefined, 'process jobs', {}, async () => {
        throw new Error('model down');
      }),
    ).rejects.toThrow('model down');
    const [span] = exporter.getFinishedSpans();
    expect(span.parentSpanContext).toBeUndefined();
    expect(span.status).toMatchObject({ code: 2, message: 'model down' });
    expect(span.events.map((e) => e.name)).toEqual(['exception']);
  });
});
