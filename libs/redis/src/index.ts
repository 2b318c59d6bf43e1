export * from './redis.constants';
export * from './redis.module';
export * from './redis.module-definition';
export * from './create-redis-client';
export * from './redis-script';
export * from './partition-tags';
export * from './durable-write-decision';
export * from './master-replicas';
