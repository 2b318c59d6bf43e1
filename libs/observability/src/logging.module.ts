import { DynamicModule, Module } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { LoggerModule } from 'nestjs-pino';
import { destination, type LevelWithSilent } from 'pino';
import type { Options as HttpLoggerOptions } from 'pino-http';
import { answeredByServer } from './answered-by-server';
import { redactedUrl } from './redacted-url';

export interface LoggingOptions {
  readonly level: string;
  /** The app's name on every line. */
  readonly app: string;
}

const REQUEST_ID = /^[\w.:-]{1,128}$/;
/** Bytes of lines held before a write: a few dozen lines. */
export const LOG_BUFFER_BYTES = 4096;
/** The longest a line waits in the buffer. */
export const LOG_FLUSH_MS = 50;

const isProbe = (url: string | undefined): boolean =>
  url !== undefined && (url.startsWith('/health/') || url === '/metrics');

/**
 * JSON logs through pino, one line per answer with a request id (taken from
 * X-Request-Id when it looks like one, else new, and echoed back). Secrets and
 * bodies stay out: no header of the request or the answer is logged, and
 * query values are redacted.
 *
 * Lines go to stdout asynchronously, in batches: a line is buffered until
 * LOG_BUFFER_BYTES are waiting or the next LOG_FLUSH_MS tick, so under load
 * the lines of many answers go in one write() (a write per line was a
 * syscall per request, the largest part of a line's cost), an idle app's
 * lines are out within about twice LOG_FLUSH_MS (a tick that finds a write
 * under way leaves its lines for the next), and a slow reader of stdout (a
 * full pipe to the container runtime) never stalls the event loop, as a
 * synchronous write would. pino flushes what is left when the process exits
 * (shutdown ends in process.exit, an uncaught error too); a death without an
 * exit (SIGKILL, V8 out of memory, a native crash) loses the lines of its
 * last moment.
 */
@Module({})
export class LoggingModule {
  static forRoot(options: LoggingOptions): DynamicModule {
    const stream = destination({ dest: 1, sync: false, minLength: LOG_BUFFER_BYTES, periodicFlush: LOG_FLUSH_MS });
    return {
      module: LoggingModule,
      global: true,
      imports: [LoggerModule.forRoot({ pinoHttp: [httpLogOptions(options), stream] })],
      exports: [LoggerModule],
    };
  }
}

function httpLogOptions(options: LoggingOptions): HttpLoggerOptions {
  return {
    level: options.level,
    base: { app: options.app },
    messageKey: 'msg',
    genReqId: (req: IncomingMessage, res: ServerResponse) => {
      const given = req.headers['x-request-id'];
      const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
      res.setHeader('X-Request-Id', id);
      return id;
    },
    // Every answer gets its line, except probes and scrapes that succeed
    // (a failing readiness check is worth a line, the kubelet's every
    // ten seconds is not; http_request_duration_seconds counts them all)
    // and requests the server itself answered and logged (libs/http).
    customLogLevel: (req: IncomingMessage, res: ServerResponse, err?: Error): LevelWithSilent =>
      (!err && res.statusCode < 400 && isProbe(req.url)) || answeredByServer(req) ? 'silent' : 'info',
    // What a line says of the request and the answer: nothing else of either, so no header (the
    // Authorization, the idempotency key, a cookie) and no body reaches a line, and nothing needs
    // redacting afterwards (pino's redaction, of paths these never hold, cost a tenth of a line).
    // Also what libs/http's own refusal lines (a 408 before any route) log as `req`.
    // Given the request and the answer themselves, not pino-std-serializers' copies of them: those read every
    // header, the query string (Express parses it for them) and the answer's headers, twice a request, for the
    // three fields kept here. What they would have given these three is what is read, as they read it.
    wrapSerializers: false,
    serializers: {
      req: (req: { id: unknown; method: string; url: string; originalUrl?: string }) => ({
        id: req.id,
        method: req.method,
        url: redactedUrl(req.originalUrl || req.url),
      }),
      // An answer logged before its head was sent (the caller went away first) has no status yet.
      res: (res: { statusCode: number; headersSent?: boolean }) => ({
        statusCode: res.headersSent ? res.statusCode : null,
      }),
    },
  };
}
