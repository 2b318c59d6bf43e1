export * from './metrics.module';
export * from './logging.module';
