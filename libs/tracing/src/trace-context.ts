import type * as OpenTelemetryApi from '@opentelemetry/api';
import type { Attributes, Span } from '@opentelemetry/api';

/**
 * Where a trace crosses something that is not a request, it rides as W3C's
 * `traceparent`: a stream entry's field, an outbox row's column, the header's
 * own name.
 */
export const TRACEPARENT = 'traceparent';

/** @opentelemetry/api's SpanKind values, here so that naming one needs no import of it. */
export const SpanKind = { INTERNAL: 0, SERVER: 1, CLIENT: 2, PRODUCER: 3, CONSUMER: 4 } as const;

/** @opentelemetry/api's SpanStatusCode values, as SpanKind's. */
export const SpanStatusCode = { UNSET: 0, OK: 1, ERROR: 2 } as const;

/**
 * The OpenTelemetry API once the SDK is started (useOpenTelemetry), else
 * undefined: with tracing off the helpers below call nothing of it (not
 * even its no-ops), write no field and run the work as it is.
 */
let otel: typeof OpenTelemetryApi | undefined;
let tracer: OpenTelemetryApi.Tracer | undefined;
let nameRoute: ((route: string) => void) | undefined;

/**
 * Called by the SDK's start (tracing-sdk.ts) once its provider, propagator and context manager are registered.
 * `httpRoute` names the route of the request being served, as the Express instrumentation does for a route
 * Express dispatches.
 */
export function useOpenTelemetry(api: typeof OpenTelemetryApi | undefined, httpRoute?: (route: string) => void): void {
  otel = api;
  tracer = api?.trace.getTracer('llm-workflows');
  nameRoute = api ? httpRoute : undefined;
}

/**
 * The route pattern of the HTTP request being served, for its server span (`http.route`, and the span's name):
 * for a route served without Express's router, whose instrumentation would otherwise name it. Nothing when
 * tracing is off.
 */
export function setHttpRoute(route: string): void {
  nameRoute?.(route);
}

/** The active span's traceparent, to store beside work queued for later; undefined when tracing is off. */
export function activeTraceparent(): string | undefined {
  if (!otel) return undefined;
  const carrier: Record<string, string> = {};
  otel.propagation.inject(otel.context.active(), carrier);
  return carrier[TRACEPARENT];
}

export interface SpanOptions {
  readonly kind?: (typeof SpanKind)[keyof typeof SpanKind];
  readonly attributes?: Attributes;
}

/**
 * Runs `work` in a span whose parent is the one that queued it (`traceparent`,
 * as activeTraceparent wrote it), whatever is active here: a delivery of a
 * stream entry, a send of an outbox row, each continuing its request's trace.
 * Without one (tracing was off when it was queued) the span starts a trace.
 * `work` gets the span (undefined when tracing is off).
 */
export function inSpanFrom<T>(
  traceparent: string | undefined,
  name: string,
  options: SpanOptions | (() => SpanOptions),
  work: (span?: Span) => Promise<T>,
): Promise<T> {
  const api = otel;
  if (!api || !tracer) return work();
  const root = api.ROOT_CONTEXT;
  const parent = traceparent ? api.propagation.extract(root, { [TRACEPARENT]: traceparent }) : root;
  return tracer.startActiveSpan(name, spanOptions(options), parent, (span) => ended(api, span, work));
}

/** Runs `work` in a span, child of the active one. */
export function inSpan<T>(
  name: string,
  options: SpanOptions | (() => SpanOptions),
  work: (span?: Span) => Promise<T>,
): Promise<T> {
  const api = otel;
  if (!api || !tracer) return work();
  return tracer.startActiveSpan(name, spanOptions(options), (span) => ended(api, span, work));
}

/** Options may be a function: what only a span needs is not even built when tracing is off. */
function spanOptions(given: SpanOptions | (() => SpanOptions)): OpenTelemetryApi.SpanOptions {
  const o = typeof given === 'function' ? given() : given;
  return {
    ...(o.kind === undefined ? {} : { kind: o.kind }),
    ...(o.attributes === undefined ? {} : { attributes: o.attributes }),
  };
}

async function ended<T>(api: typeof OpenTelemetryApi, span: Span, work: (span?: Span) => Promise<T>): Promise<T> {
  try {
    return await work(span);
  } catch (err) {
    span.recordException(err instanceof Error ? err : String(err));
    span.setStatus({ code: api.SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
    throw err;
  } finally {
    span.end();
  }
}

/**
 * Names the outcome of a span's work (`outcome`), and ends the span as an error when it is a failure the work
 * returned rather than threw (a send the relay will retry or parked, a delivery left for redelivery or dead-lettered):
 * tail sampling and a trace view pick out failed spans by their status, not by an attribute. A no-op without a span.
 */
export function setOutcome(span: Span | undefined, outcome: string, failed: boolean): void {
  if (!span) return;
  span.setAttribute('outcome', outcome);
  if (failed) span.setStatus({ code: SpanStatusCode.ERROR, message: outcome });
}

export type { Span };
