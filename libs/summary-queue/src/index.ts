export * from './summary-job';
export * from './summary-job.message';
export * from './summary-ready';
export * from './summary-streams';
export * from './summary-job.queue';
export * from './summary-queue.module-definition';
export * from './summary-queue.module';
export * from './dead-letters';
