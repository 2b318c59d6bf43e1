export * from './summary-job';
export * from './summary-job.message';
export * from './summary-ready';
export * from './summary-job.queue';
export * from './summary-queue.module';
export * from './dead-letters';
