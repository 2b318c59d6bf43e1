import { type INestApplication, Logger as NestLogger } from '@nestjs/common';
import { ConfigValidationError } from '@app/config';
import type { Server } from 'node:http';
import { Logger } from 'nestjs-pino';
import { Registry } from 'prom-client';
import { configureHttpServer } from './http-server';
import type { HttpServerSettings } from './http-server.settings';
import { captureProcessWarnings } from './process-warnings';
import { handleStopSignals } from './stop-signals';

const SHUTDOWN_SIGNALS: NodeJS.Signals[] = ['SIGTERM', 'SIGINT'];

export interface ServedApp {
  readonly app: INestApplication;
  readonly port: number;
  /** The app's configuration: it has the server's settings. */
  readonly http: HttpServerSettings;
}

/**
 * The whole of an app's main.ts: builds the app, serves it on `port` with the
 * server's limits and JSON-only logs; SIGTERM and SIGINT drain (the modules'
 * shutdown hooks) and exit 0 rather than re-raising the signal, a repeat is
 * ignored and a third signal exits at once (stop-signals.ts). A
 * configuration error is one line naming each bad variable, any other
 * failure to start its stack; both exit 1.
 */
export function serveHttpApp(name: string, build: () => Promise<ServedApp>): void {
  const warnings = captureProcessWarnings();
  const start = async (): Promise<void> => {
    const { app, port, http } = await build();
    const logger = app.get(Logger);
    app.useLogger(logger);
    // Nest's Logger, not pino's directly: it takes (fields, message) and adds its context.
    warnings.logTo(new NestLogger('ProcessWarning'));
    configureHttpServer(app.getHttpServer() as Server, http, new NestLogger('HttpServer'), app.get(Registry));
    app.enableShutdownHooks(SHUTDOWN_SIGNALS, { useProcessExit: true });
    // After Nest's: a repeat is ignored until the exit, a third signal ends a drain that hangs.
    handleStopSignals(SHUTDOWN_SIGNALS, new NestLogger('Shutdown'));
    await app.listen(port);
  };
  start().catch((err: unknown) => {
    process.stderr.write(
      err instanceof ConfigValidationError
        ? `${name}: ${err.message}\n`
        : `${name}: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
    );
    process.exit(1);
  });
}
