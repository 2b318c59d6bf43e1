import 'reflect-metadata';
import { serveHttpApp } from '@app/http';
import { NestFactory } from '@nestjs/core';
import { loadWorkerConfig } from './worker.config';
import { WorkerModule } from './worker.module';

serveHttpApp('worker', async () => {
  const config = loadWorkerConfig();
  // No body parser: health and metrics take no bodies, and Nest's default parser would answer its own errors unlogged.
  const app = await NestFactory.create(WorkerModule.forRoot(config), { bodyParser: false, bufferLogs: true });
  return { app, port: config.healthPort, http: config };
});
