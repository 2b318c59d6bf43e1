export * from './operations.service';
export * from './operations.module';
