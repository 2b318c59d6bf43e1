import { type ConfigOf, env } from '@app/config';

/** The protocols the apps export with: OTLP over HTTP. gRPC would add @grpc/grpc-js to every image for no gain. */
export const OTLP_PROTOCOLS = ['http/protobuf', 'http/json'] as const;
export type OtlpProtocol = (typeof OTLP_PROTOCOLS)[number];

/**
 * The api's, the worker's and the relay's traces (INTERFACE.md): the standard OpenTelemetry variables that decide
 * whether, how and how often. The exporter reads the other `OTEL_EXPORTER_OTLP_*` ones itself (headers, timeout,
 * the traces endpoint, certificates), and `OTEL_RESOURCE_ATTRIBUTES` is added to each span's resource.
 */
export const tracingEnv = {
  otlpEndpoint: env.optionalUrl('OTEL_EXPORTER_OTLP_ENDPOINT', ['http:', 'https:'], {
    describe:
      'set: spans are exported there by OTLP over HTTP (`/v1/traces` appended), `service.name` the app; ' +
      'unset: the OpenTelemetry SDK is not even loaded. See [Traces](#traces)',
    docDefault: 'unset',
  }),
  otlpProtocol: env.oneOf<OtlpProtocol>('OTEL_EXPORTER_OTLP_PROTOCOL', 'http/protobuf', OTLP_PROTOCOLS, {
    describe: '`http/protobuf` or `http/json` (no gRPC)',
  }),
  otelScheduleDelayMs: env.int(
    'OTEL_BSP_SCHEDULE_DELAY',
    5000,
    { min: 1, max: 3_600_000 },
    { describe: 'milliseconds between two exports of the spans ended meanwhile' },
  ),
};

export type TracingConfig = ConfigOf<typeof tracingEnv>;

/**
 * Whether an app with this configuration traces: OTEL_EXPORTER_OTLP_ENDPOINT alone decides (startTracing starts the
 * SDK on it). What writes or reads trace context outside a process (the relay's claim of `outbox.traceparent`) asks
 * this rather than the variable.
 */
export const tracingOn = (config: Pick<TracingConfig, 'otlpEndpoint'>): boolean => config.otlpEndpoint !== undefined;
