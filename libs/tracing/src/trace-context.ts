import {
  type Attributes,
  context,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api';

/**
 * Where a trace crosses something that is not a request, it rides as W3C's
 * `traceparent`: a stream entry's field, an outbox row's column, the header's
 * own name. Only @opentelemetry/api is used here, which does nothing when no
 * SDK is registered (tracing off): no field is written then, and the spans
 * below are no-ops.
 */
export const TRACEPARENT = 'traceparent';

const tracer = trace.getTracer('llm-workflows');

/** The active span's traceparent, to store beside work queued for later; undefined when tracing is off. */
export function activeTraceparent(): string | undefined {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return carrier[TRACEPARENT];
}

export interface SpanOptions {
  readonly kind?: SpanKind;
  readonly attributes?: Attributes;
}

/**
 * Runs `work` in a span whose parent is the one that queued it (`traceparent`,
 * as activeTraceparent wrote it), whatever is active here: a delivery of a
 * stream entry, a send of an outbox row, each continuing its request's trace.
 * Without one (tracing was off when it was queued) the span starts a trace.
 */
export function inSpanFrom<T>(
  traceparent: string | undefined,
  name: string,
  options: SpanOptions,
  work: (span: Span) => Promise<T>,
): Promise<T> {
  const parent = traceparent ? propagation.extract(ROOT_CONTEXT, { [TRACEPARENT]: traceparent }) : ROOT_CONTEXT;
  return tracer.startActiveSpan(name, options, parent, (span) => ended(span, work));
}

/** Runs `work` in a span, child of the active one. */
export function inSpan<T>(name: string, options: SpanOptions, work: (span: Span) => Promise<T>): Promise<T> {
  return tracer.startActiveSpan(name, options, (span) => ended(span, work));
}

async function ended<T>(span: Span, work: (span: Span) => Promise<T>): Promise<T> {
  try {
    return await work(span);
  } catch (err) {
    span.recordException(err instanceof Error ? err : String(err));
    span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
    throw err;
  } finally {
    span.end();
  }
}

export { SpanKind, SpanStatusCode };
export type { Span };
