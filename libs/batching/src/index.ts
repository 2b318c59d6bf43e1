export * from './micro-batcher';
