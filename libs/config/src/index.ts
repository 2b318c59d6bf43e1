export * from './config.errors';
export * from './env-schema';
export * from './config-problems';
export * from './backoff';
export * from './config-reference';
