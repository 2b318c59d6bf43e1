import './tracing';
import 'reflect-metadata';
import { serveHttpApp } from '@app/http';
import { loadApiConfig } from './api.config';
import { ApiModule } from './api.module';
import { createApiApp } from './create-api-app';

serveHttpApp('api', async () => {
  const config = loadApiConfig();
  const app = await createApiApp(ApiModule.forRoot(config));
  return { app, port: config.port, http: config };
});
