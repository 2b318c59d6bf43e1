import { Controller, Get, HttpStatus, Inject, ServiceUnavailableException } from '@nestjs/common';
import { HealthCheckService, HealthIndicatorService, type HealthIndicatorFunction } from '@nestjs/terminus';
import { ProblemException, PROBLEM_TYPE_PREFIX } from '@app/problem';
import { HealthChecksRegistry } from './health-checks.registry';
import { READINESS_INDICATORS, type ReadinessIndicator } from './readiness-indicator';

export const HealthProblemTypes = {
  notLive: `${PROBLEM_TYPE_PREFIX}health-not-live`,
  notReady: `${PROBLEM_TYPE_PREFIX}health-not-ready`,
} as const;

@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly indicators: HealthIndicatorService,
    @Inject(READINESS_INDICATORS) private readonly readiness: readonly ReadinessIndicator[],
    private readonly registry: HealthChecksRegistry,
  ) {}

  /** The process can serve. Nothing outside the process is checked. */
  @Get('live')
  live(): { status: 'ok' } {
    const stale = this.registry.staleLoops();
    if (stale.length > 0) {
      throw new ProblemException({
        type: HealthProblemTypes.notLive,
        title: 'A loop of this process is stuck',
        status: HttpStatus.SERVICE_UNAVAILABLE,
        detail: stale.map((l) => `${l.name} has not turned for ${l.silentMs} ms`).join('; '),
        extensions: { stale },
      });
    }
    return { status: 'ok' };
  }

  /** The app's readiness indicators (HealthModule.forRoot) and whatever it registered answer. */
  @Get('ready')
  async ready(): Promise<unknown> {
    const checks: HealthIndicatorFunction[] = this.readiness.map((indicator) => () => indicator.check());
    for (const [name, check] of this.registry.readinessChecks()) {
      checks.push(() => this.indicators.check(name).attempt(check).withTimeout(1000));
    }
    try {
      return await this.health.check(checks);
    } catch (err) {
      if (!(err instanceof ServiceUnavailableException)) throw err;
      const result = err.getResponse() as { error?: Record<string, unknown>; details?: Record<string, unknown> };
      const failing = Object.keys(result.error ?? {});
      throw new ProblemException({
        type: HealthProblemTypes.notReady,
        title: 'Not ready',
        status: HttpStatus.SERVICE_UNAVAILABLE,
        detail: `failing: ${failing.join(', ')}`,
        extensions: { failing, checks: result.details ?? {} },
      });
    }
  }
}
