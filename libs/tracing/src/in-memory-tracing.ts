import * as api from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { useOpenTelemetry } from './trace-context';

/**
 * For tests: tracing on in this process as tracing-sdk.ts turns it on, its
 * spans exported to memory. Registers jest's beforeAll (on), afterAll (off
 * again) and beforeEach (the spans of the last test forgotten); returns the
 * exporter to read them from. Not exported by the library's index.
 */
export function useInMemoryTracing(): InMemorySpanExporter {
  const exporter = new InMemorySpanExporter();
  const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
  beforeAll(() => {
    api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    api.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    api.trace.setGlobalTracerProvider(provider);
    useOpenTelemetry(api);
  });
  afterAll(async () => {
    useOpenTelemetry(undefined);
    await provider.shutdown();
    api.trace.disable();
    api.propagation.disable();
    api.context.disable();
  });
  beforeEach(() => exporter.reset());
  return exporter;
}
