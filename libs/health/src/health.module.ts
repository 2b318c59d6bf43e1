import { Global, Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { HealthChecksRegistry } from './health-checks.registry';
import { HealthController } from './health.controller';
import { PostgresHealthIndicator } from './postgres.health';
import { RedisHealthIndicator } from './redis.health';

/**
 * GET /health/live and /health/ready for any app that has the global
 * RedisModule and a TypeORM DataSource. Global so that loops anywhere in the
 * app can report to HealthChecksRegistry.
 */
@Global()
@Module({
  imports: [TerminusModule.forRoot({ logger: false })],
  controllers: [HealthController],
  providers: [RedisHealthIndicator, PostgresHealthIndicator, HealthChecksRegistry],
  exports: [HealthChecksRegistry],
})
export class HealthModule {}
