export * from './summary-job';
export * from './summary-ready';
export * from './summary-job.queue';
export * from './uuid-v5';
export * from './jobs.module';
export * from './dead-letters';
