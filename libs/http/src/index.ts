export * from './create-http-app';
export * from './express-prototypes';
export * from './http-server.settings';
export * from './http-server';
export * from './process-warnings';
export * from './serve-http-app';
export * from './node-http.transport';
