export * from './queue-layout';
