import 'reflect-metadata';
import { serveHttpApp } from '@app/http';
import { NestFactory } from '@nestjs/core';
import { loadRelayConfig } from './relay.config';
import { RelayModule } from './relay.module';

serveHttpApp('relay', async () => {
  const config = loadRelayConfig();
  // No body parser: health and metrics take no bodies, and Nest's default parser would answer its own errors unlogged.
  const app = await NestFactory.create(RelayModule.forRoot(config), { bodyParser: false, bufferLogs: true });
  return { app, port: config.healthPort, http: config };
});
