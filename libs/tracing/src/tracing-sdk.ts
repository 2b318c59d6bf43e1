import * as api from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtobufExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { ExpressInstrumentation, ExpressLayerType } from '@opentelemetry/instrumentation-express';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import { IORedisInstrumentation } from '@opentelemetry/instrumentation-ioredis';
import { PgInstrumentation } from '@opentelemetry/instrumentation-pg';
import { PinoInstrumentation } from '@opentelemetry/instrumentation-pino';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
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
 * propagator: `traceparent` on every outgoing request (http, and fetch
 * through undici: the model call, the gateway's upstream, the webhook), and
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
  useOpenTelemetry(api);
  registerInstrumentations({
    tracerProvider: provider,
    instrumentations: [
      new HttpInstrumentation({ ignoreIncomingRequestHook: (req) => isProbe(req.url) }),
      new ExpressInstrumentation({ ignoreLayersType: [ExpressLayerType.MIDDLEWARE] }),
      new IORedisInstrumentation({ requireParentSpan: true }),
      new PgInstrumentation({ requireParentSpan: true }),
      new UndiciInstrumentation({ requireParentforSpans: true }),
      new PinoInstrumentation({ disableLogSending: true }),
    ],
  });
  // At shutdown the drain is over: a collector that does not answer must not hold the exit up to the
  // exporter's timeouts (10 s a request, 30 s a batch) and past the pod's grace period.
  return () => Promise.race([provider.shutdown(), sleep(SHUTDOWN_FLUSH_MS, undefined, { ref: false })]);
}
