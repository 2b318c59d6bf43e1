export * from './metrics.module';
export * from './logging.module';
export * from './http-metrics.middleware';
export * from './scrape-once';
export * from './answered-by-server';
export * from './redacted-url';
