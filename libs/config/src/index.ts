export * from './config.errors';
export * from './env-schema';
