import { type Env, parseConfig, processEnv } from '@app/config';
import { tracingEnv, tracingOn } from './tracing.env';

/** Flushes the spans still buffered and stops exporting; set once the SDK is started. */
let stop: (() => Promise<void>) | undefined;

/**
 * Starts the OpenTelemetry SDK for `service` when OTEL_EXPORTER_OTLP_ENDPOINT
 * is set, and does nothing else otherwise: the SDK, its exporters and
 * instrumentations are not even loaded. Called from each app's `tracing.ts`,
 * which main.ts imports before anything else: the instrumentations patch
 * http, express, ioredis, pg and pino as they are required (the bundles keep
 * node_modules external, so they are required at run time), which must come
 * after this. A bad value is left to the app's configuration, which reports
 * it by name and stops the start. Returns whether it started.
 */
export function startTracing(service: string, source: Env = processEnv()): boolean {
  if (stop) return true;
  let config;
  try {
    config = parseConfig(tracingEnv, source);
  } catch {
    return false;
  }
  if (!tracingOn(config)) return false;
  // Required here, not imported: a static import would load the SDK in every process, traced or not.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const sdk = require('./tracing-sdk') as typeof import('./tracing-sdk');
  stop = sdk.startSdk(service, config);
  return true;
}

/** Exports what is buffered and stops; at once when tracing is off. */
export async function shutdownTracing(): Promise<void> {
  const s = stop;
  stop = undefined;
  await s?.();
}
