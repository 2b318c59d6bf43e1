import { DynamicModule, Global, Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { HealthChecksRegistry } from './health-checks.registry';
import { HealthController } from './health.controller';
import { READINESS_INDICATORS, type ReadinessIndicator, type ReadinessIndicatorClass } from './readiness-indicator';

export interface HealthModuleOptions {
  /**
   * What /health/ready checks besides the checks the app registers at run
   * time (HealthChecksRegistry): each app lists the dependencies it uses, so
   * one that has no Redis neither checks nor connects to it. Each indicator's
   * own dependencies (the Redis client, the DataSource) come from the app's
   * global modules.
   */
  readonly readiness: readonly ReadinessIndicatorClass[];
}

/**
 * GET /health/live and /health/ready. Global so that loops anywhere in the
 * app can report to HealthChecksRegistry.
 *
 * A hand-written `forRoot` rather than ConfigurableModuleBuilder: the
 * indicators are providers (classes resolved when the module is compiled), not
 * an options value, so a `forRootAsync` would have nothing to compute; the
 * shape is @nestjs/terminus's own `TerminusModule.forRoot`.
 */
@Global()
@Module({})
export class HealthModule {
  static forRoot(options: HealthModuleOptions): DynamicModule {
    const readiness = [...options.readiness];
    return {
      module: HealthModule,
      imports: [TerminusModule.forRoot({ logger: false })],
      controllers: [HealthController],
      providers: [
        ...readiness,
        {
          provide: READINESS_INDICATORS,
          inject: readiness,
          useFactory: (...indicators: ReadinessIndicator[]) => indicators,
        },
        HealthChecksRegistry,
      ],
      exports: [HealthChecksRegistry],
    };
  }
}
