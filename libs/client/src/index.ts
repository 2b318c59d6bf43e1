export * from './api-client';
export * from './api-result';
export * from './idempotency-key';
export * from './refunds.routes';
export * from './retry-decision';
export * from './summaries.routes';
