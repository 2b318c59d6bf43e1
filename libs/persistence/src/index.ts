export * from './entities/summary.entity';
export * from './entities/outbox.entity';
export * from './data-source-options';
export * from './persistence.module';
export * from './outbox-channel';
export * from './repositories/summary.repository';
export * from './summary-writer.service';
export * from './repositories/outbox-admin.repository';
