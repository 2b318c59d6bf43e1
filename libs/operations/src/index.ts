export * from './operations.service';
export * from './operations.module';
export * from './admin-action-counts';
export * from './admin-ids';
