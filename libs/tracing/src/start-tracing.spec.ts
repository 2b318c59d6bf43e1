import { startTracing } from './start-tracing';

describe('startTracing', () => {
  it('starts nothing without OTEL_EXPORTER_OTLP_ENDPOINT, whatever else is set', () => {
    expect(startTracing('api', {})).toBe(false);
    expect(startTracing('api', { OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_BSP_SCHEDULE_DELAY: '10' })).toBe(
      false,
    );
  });

  it("leaves a bad value to the app's configuration, which names it: no tracing meanwhile", () => {
    expect(
      startTracing('api', {
        OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318',
        OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc',
      }),
    ).toBe(false);
    expect(startTracing('api', { OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' })).toBe(false);
  });
});
