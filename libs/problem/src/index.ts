export * from './problem';
export * from './problem-types';
export * from './to-problem';
export * from './problem-details.filter';
export * from './request-validation.pipe';
export * from './body-parser-errors';
export * from './json-depth-limit.middleware';
export * from './api-problem-response';
