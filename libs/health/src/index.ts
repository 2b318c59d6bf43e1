export * from './health.module';
export * from './health-checks.registry';
export * from './health.controller';
export * from './readiness-indicator';
export * from './redis.health';
export * from './postgres.health';
