import { DynamicModule, Module } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { LoggerModule } from 'nestjs-pino';
import { destination } from 'pino';
import { answeredByServer } from './answered-by-server';
import { redactedUrl } from './redacted-url';

export interface LoggingOptions {
  readonly level: string;
  /** The app's name on every line. */
  readonly app: string;
}

const REQUEST_ID = /^[\w.:-]{1,128}$/;

const isProbe = (url: string | undefined): boolean =>
  url !== undefined && (url.startsWith('/health/') || url === '/metrics');

/**
 * JSON logs through pino, one line per answer with a request id (taken from
 * X-Request-Id when it looks like one, else new, and echoed back). Secrets and
 * bodies stay out: auth headers, idempotency keys and query values are
 * redacted.
 *
 * Lines go to stdout asynchronously: a line is handed to the kernel once the
 * write before it is done, so under load the lines of many answers go in one
 * write(), and a slow reader of stdout (a full pipe to the container runtime)
 * never stalls the event loop, as a synchronous write would. Nothing waits
 * for a buffer to fill, so an idle app's lines are out at once; pino flushes
 * what is left when the process exits (shutdown ends in process.exit), and
 * only a SIGKILL can lose the lines of its last moment.
 */
@Module({})
export class LoggingModule {
  static forRoot(options: LoggingOptions): DynamicModule {
    return {
      module: LoggingModule,
      global: true,
      imports: [
        LoggerModule.forRoot({
          pinoHttp: [
            {
              level: options.level,
              base: { app: options.app },
              messageKey: 'msg',
              genReqId: (req: IncomingMessage, res) => {
                const given = req.headers['x-request-id'];
                const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
                res.setHeader('X-Request-Id', id);
                return id;
              },
              // Every answer gets its line, except probes and scrapes that succeed
              // (a failing readiness check is worth a line, the kubelet's every
              // ten seconds is not; http_request_duration_seconds counts them all)
              // and requests the server itself answered and logged (libs/http).
              customLogLevel: (req: IncomingMessage, res: ServerResponse, err?: Error) =>
                (!err && res.statusCode < 400 && isProbe(req.url)) || answeredByServer(req) ? 'silent' : 'info',
              redact: {
                paths: [
                  'req.headers.authorization',
                  'req.headers.cookie',
                  'req.headers["idempotency-key"]',
                  'req.headers["x-admin-key"]',
                  'res.headers["set-cookie"]',
                ],
                censor: '[redacted]',
              },
              // Also what libs/http's own refusal lines (a 408 before any route) log as `req`.
              serializers: {
                req: (req: { id: unknown; method: string; url: string }) => ({
                  id: req.id,
                  method: req.method,
                  url: redactedUrl(req.url),
                }),
              },
            },
            destination({ dest: 1, sync: false }),
          ],
        }),
      ],
      exports: [LoggerModule],
    };
  }
}
