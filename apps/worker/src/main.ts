import 'reflect-metadata';
import { ConfigValidationError } from '@app/config';
import { NestFactory } from '@nestjs/core';
import { Logger } from 'nestjs-pino';
import { loadWorkerConfig } from './worker.config';
import { WorkerModule } from './worker.module';

async function main(): Promise<void> {
  const config = loadWorkerConfig();
  const app = await NestFactory.create(WorkerModule.forRoot(config), { bufferLogs: true });
  app.useLogger(app.get(Logger));
  // SIGTERM drains (the modules' shutdown hooks), then exits 0, not by re-raising the signal.
  app.enableShutdownHooks(['SIGTERM', 'SIGINT'], { useProcessExit: true });
  await app.listen(config.healthPort);
}

main().catch((err: unknown) => {
  process.stderr.write(
    err instanceof ConfigValidationError
      ? `worker: ${err.message}\n`
      : `worker: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
  );
  process.exit(1);
});
