export * from './payments-provider';
export * from './http-payments.provider';
export * from './fake-payments.provider';
