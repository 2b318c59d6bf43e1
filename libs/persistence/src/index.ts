export * from './entities/summary.entity';
export * from './entities/outbox.entity';
export * from './data-source-options';
export * from './persistence.module';
