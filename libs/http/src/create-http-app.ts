import type { DynamicModule, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';

/**
 * Every app's Nest application, made one way: without Nest's default body
 * parser, whose errors are answered before the logging and metrics middleware
 * see them (an app that takes bodies mounts its own: useJsonBody), and with
 * its logs held until main.ts puts pino in place.
 */
export function createHttpApp(root: DynamicModule | Type): Promise<NestExpressApplication> {
  return NestFactory.create<NestExpressApplication>(root, { bodyParser: false, bufferLogs: true });
}
