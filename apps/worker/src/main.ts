import './tracing';
import 'reflect-metadata';
import { createHttpApp, serveHttpApp } from '@app/http';
import { loadWorkerConfig } from './worker.config';
import { WorkerModule } from './worker.module';

serveHttpApp('worker', async () => {
  const config = loadWorkerConfig();
  const app = await createHttpApp(WorkerModule.forRoot(config));
  return { app, port: config.healthPort, http: config };
});
