import { startTracing } from '@app/tracing';

// Imported first by main.ts: the instrumentations must be in place before http, express, ioredis, pg and pino load.
startTracing('worker');
