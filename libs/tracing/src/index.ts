export * from './tracing.env';
export * from './start-tracing';
export * from './trace-context';
export * from './tracing.module';
