import type { Type } from '@nestjs/common';
import type { HealthIndicatorResult } from '@nestjs/terminus';

/**
 * A dependency the app needs in order to serve: one terminus check under its
 * own key (`HealthIndicatorService.check(key)`), with its own timeout.
 * `RedisHealthIndicator` and `PostgresHealthIndicator` are two; an app lists
 * the ones it uses in `HealthModule.forRoot({ readiness })`.
 */
export interface ReadinessIndicator {
  check(): PromiseLike<HealthIndicatorResult>;
}

/** The app's readiness indicators, in the order `forRoot` listed them. */
export const READINESS_INDICATORS = 'health:readiness-indicators';

export type ReadinessIndicatorClass = Type<ReadinessIndicator>;
