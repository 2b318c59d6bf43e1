import { type DynamicModule, Logger, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { ExpressAdapter, NestExpressApplication } from '@nestjs/platform-express';
import { useExpressPrototypes } from './express-prototypes';

/**
 * Every app's Nest application, made one way: without Nest's default body
 * parser, whose errors are answered before the logging and metrics middleware
 * see them (an app that takes bodies mounts its own: useJsonBody), and with
 * its logs held until main.ts puts pino in place; its server making
 * requests with Express's prototypes (useExpressPrototypes). `adapter`: an
 * Express adapter of the app's own (the api's sends idempotent replays
 * directly).
 */
export async function createHttpApp(
  root: DynamicModule | Type,
  adapter?: ExpressAdapter,
): Promise<NestExpressApplication> {
  const options = { bodyParser: false, bufferLogs: true };
  const app = await (adapter
    ? NestFactory.create<NestExpressApplication>(root, adapter, options)
    : NestFactory.create<NestExpressApplication>(root, options));
  if (!useExpressPrototypes(app))
    new Logger('HttpServer').warn(
      "The server makes requests with Node's own classes: Express changes their prototypes on every request",
    );
  return app;
}
