import 'reflect-metadata';
import { ConfigValidationError } from '@app/config';
import { NestFactory } from '@nestjs/core';
import { Logger } from 'nestjs-pino';
import { loadRelayConfig } from './relay.config';
import { RelayModule } from './relay.module';

async function main(): Promise<void> {
  const config = loadRelayConfig();
  const app = await NestFactory.create(RelayModule.forRoot(config), { bufferLogs: true });
  app.useLogger(app.get(Logger));
  // useProcessExit: after the drain, exit 0; without it Nest re-raises the signal and the process dies of SIGTERM (143).
  app.enableShutdownHooks([], { useProcessExit: true });
  await app.listen(config.healthPort);
}

main().catch((err: unknown) => {
  process.stderr.write(
    err instanceof ConfigValidationError
      ? `relay: ${err.message}\n`
      : `relay: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
  );
  process.exit(1);
});
