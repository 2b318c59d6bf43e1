import * as api from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { getRPCMetadata, RPCType, W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtobufExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { ExpressInstrumentation, ExpressLayerType } from '@opentelemetry/instrumentation-express';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import type { RequestOptions } from 'node:http';
import { isIPv6 } from 'node:net';
import { IORedisInstrumentation } from '@opentelemetry/instrumentation-ioredis';
import { PgInstrumentation } from '@opentelemetry/instrumentation-pg';
import { PinoInstrumentation } from '@opentelemetry/instrumentation-pino';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { redactedUrl } from '@app/observability/redacted-url';
import { useOpenTelemetry } from './trace-context';
import type { TracingConfig } from './tracing.env';
import { setTimeout as sleep } from 'node:timers/promises';

/** How long the last export may take at shutdown; what is not out by then is lost. */
const SHUTDOWN_FLUSH_MS = 2000;

/** Probes and scrapes: a trace each every few seconds would bury the requests. */
const isProbe = (url: string | undefined): boolean =>
  url !== undefined && (url.startsWith('/health/') || url.startsWith('/metrics'));

/**
 * The SDK, loaded only when tracing is on (start-tracing.ts). The exporter and
 * reads the other OTEL_EXPORTER_OTLP_* variables itself (the endpoint,
 * headers). W3C trace context is the
 * propagator: `traceparent` on every outgoing request (node:http: the model
 * call, the gateway's upstream, the webhook; fetch through undici: the
 * payment provider), and
 * what libs/tracing's trace-context carries through a stream entry or an
 * outbox row. Redis and PostgreSQL commands are traced only inside a trace
 * (a request, a delivery): the polling loops (the worker's blocking reads, the
 * relay's claims) would otherwise start a trace every second. Express's
 * middleware layers are left out (Nest's route handler is the span that says
 * which route). pino gets `trace_id` and `span_id` on every line logged in a
 * span. Returns the stop that flushes, for at most SHUTDOWN_FLUSH_MS.
 */
export function startSdk(service: string, config: TracingConfig): () => Promise<void> {
  const exporter = config.otlpProtocol === 'http/json' ? new JsonExporter() : new ProtobufExporter();
  const provider = new TracerProvider({
    resource: defaultResource()
      .merge(detectResources({ detectors: [envDetector] }))
      .merge(resourceFromAttributes({ 'service.name': service })),
    spanProcessors: [new BatchSpanProcessor({ exporter, scheduledDelayMillis: config.otelScheduleDelayMs })],
  });
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  api.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  api.trace.setGlobalTracerProvider(provider);
  useOpenTelemetry(api, (route) => {
    const rpc = getRPCMetadata(api.context.active());
    if (rpc?.type === RPCType.HTTP) rpc.route = route;
  });
  registerInstrumentations({
    tracerProvider: provider,
    instrumentations: [
      // A span says of a URL what a log line says: every query value redacted (clients put keys there).
      new HttpInstrumentation({
        ignoreIncomingRequestHook: (req) => isProbe(req.url),
        startIncomingSpanHook: (req) => queryAttribute(req.url),
        // Outgoing calls over node:http (the webhook, the model, the gateway's upstreams) as undici's below.
        startOutgoingSpanHook: (options) => ({ 'url.full': outgoingUrl(options) }),
      }),
      new ExpressInstrumentation({ ignoreLayersType: [ExpressLayerType.MIDDLEWARE] }),
      // The command's name only: a script's arguments are a request's text, its email address, a stored answer.
      new IORedisInstrumentation({ requireParentSpan: true, dbStatementSerializer: (command) => command }),
      new PgInstrumentation({ requireParentSpan: true }),
      // The webhook's URL is a secret's (NOTIFY_WEBHOOK_URL): its query values are redacted, as in the logs.
      new UndiciInstrumentation({
        requireParentforSpans: true,
        startSpanHook: (request) => ({
          'url.full': `${request.origin}${redactedUrl(request.path) ?? ''}`,
          ...queryAttribute(request.path),
        }),
      }),
      new PinoInstrumentation({ disableLogSending: true }),
    ],
  });
  // At shutdown the drain is over: a collector that does not answer must not hold the exit up to the
  // exporter's timeouts (10 s a request, 30 s a batch) and past the pod's grace period.
  return () => Promise.race([provider.shutdown(), sleep(SHUTDOWN_FLUSH_MS, undefined, { ref: false })]);
}

/** An outgoing node:http request's URL, its query values redacted (redactedUrl). */
function outgoingUrl(options: RequestOptions): string {
  const host = options.hostname ?? options.host ?? 'localhost';
  const bracketed = isIPv6(host) ? `[${host}]` : host;
  const protocol = options.protocol ?? (options.agent as { protocol?: string } | undefined)?.protocol ?? 'http:';
  const port = options.port === undefined || options.port === null || options.port === '' ? '' : `:${options.port}`;
  return `${protocol}//${bracketed}${port}${redactedUrl(options.path ?? '/') ?? ''}`;
}

/** `url.query` of a request target, its values redacted (redactedUrl); nothing when it has no query. */
function queryAttribute(target: string | undefined): Record<string, string> {
  const redacted = redactedUrl(target);
  const at = redacted?.indexOf('?') ?? -1;
  return redacted === undefined || at < 0 ? {} : { 'url.query': redacted.slice(at + 1) };
}
