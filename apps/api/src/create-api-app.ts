import type { DynamicModule, INestApplication, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { bodyParserErrorHandler } from '@app/problem';
import { Logger } from 'nestjs-pino';

export const MAX_BODY_BYTES = 1024 * 1024;

/**
 * What the HTTP server needs beyond the module graph, shared by main.ts and
 * the end-to-end tests: a 1 MiB JSON body limit whose failures are
 * problem+json, pino as the logger, shutdown hooks.
 */
export function configureApiApp(app: NestExpressApplication): NestExpressApplication {
  app.useLogger(app.get(Logger));
  app.disable('x-powered-by');
  app.useBodyParser('json', { limit: MAX_BODY_BYTES });
  app.use(bodyParserErrorHandler);
  // SIGTERM drains (the modules' shutdown hooks), then exits 0, not by re-raising the signal.
  app.enableShutdownHooks(['SIGTERM', 'SIGINT'], { useProcessExit: true });
  return app;
}

export async function createApiApp(root: DynamicModule | Type): Promise<INestApplication & NestExpressApplication> {
  const app = await NestFactory.create<NestExpressApplication>(root, { bodyParser: false, bufferLogs: true });
  return configureApiApp(app);
}
