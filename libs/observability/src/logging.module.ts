import { DynamicModule, Module } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { LoggerModule } from 'nestjs-pino';

export interface LoggingOptions {
  readonly level: string;
  /** The app's name on every line. */
  readonly app: string;
}

const REQUEST_ID = /^[\w.:-]{1,128}$/;

/**
 * JSON logs through pino, one line per request with a request id (taken from
 * X-Request-Id when it looks like one, else new, and echoed back). Secrets and
 * bodies stay out: auth headers and idempotency keys are redacted.
 */
@Module({})
export class LoggingModule {
  static forRoot(options: LoggingOptions): DynamicModule {
    return {
      module: LoggingModule,
      global: true,
      imports: [
        LoggerModule.forRoot({
          pinoHttp: {
            level: options.level,
            base: { app: options.app },
            messageKey: 'msg',
            genReqId: (req: IncomingMessage, res) => {
              const given = req.headers['x-request-id'];
              const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
              res.setHeader('X-Request-Id', id);
              return id;
            },
            autoLogging: { ignore: (req: IncomingMessage) => req.url?.startsWith('/health') === true || req.url === '/metrics' },
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
            serializers: {
              req: (req: { id: unknown; method: string; url: string }) => ({ id: req.id, method: req.method, url: req.url }),
            },
          },
        }),
      ],
      exports: [LoggerModule],
    };
  }
}
