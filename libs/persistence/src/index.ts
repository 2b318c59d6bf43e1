export * from './entities/summary.entity';
export * from './entities/outbox.entity';
export * from './data-source-options';
export * from './persistence.module';
export * from './persistence.errors';
export * from './repositories/summary.repository';
export * from './repositories/outbox.repository';
export * from './summary-writer.service';
