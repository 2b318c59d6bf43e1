import './tracing';
import 'reflect-metadata';
import { createHttpApp, serveHttpApp } from '@app/http';
import { loadRelayConfig } from './relay.config';
import { RelayModule } from './relay.module';

serveHttpApp('relay', async () => {
  const config = loadRelayConfig();
  const app = await createHttpApp(RelayModule.forRoot(config));
  return { app, port: config.healthPort, http: config };
});
