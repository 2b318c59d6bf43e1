export * from './uuid-v5';
