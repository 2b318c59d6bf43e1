import { Controller, Get, Header, Global, Module } from '@nestjs/common';
import { collectDefaultMetrics, Registry } from 'prom-client';

@Controller('metrics')
export class MetricsController {
  constructor(private readonly registry: Registry) {}

  @Get()
  @Header('Content-Type', 'text/plain; version=0.0.4; charset=utf-8')
  @Header('Cache-Control', 'no-store')
  scrape(): Promise<string> {
    return this.registry.metrics();
  }
}

/**
 * One Prometheus registry per application (not prom-client's global one, so
 * several apps in one process, as in the tests, keep their own figures), and
 * GET /metrics. Libraries inject `Registry` to register their metrics.
 */
@Global()
@Module({
  controllers: [MetricsController],
  providers: [
    {
      provide: Registry,
      useFactory: () => {
        const registry = new Registry();
        collectDefaultMetrics({ register: registry });
        return registry;
      },
    },
  ],
  exports: [Registry],
})
export class MetricsModule {}
