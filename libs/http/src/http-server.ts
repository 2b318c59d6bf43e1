import type { LoggerService } from '@nestjs/common';
import { markAnsweredByServer } from '@app/observability';
import { PROBLEM_CONTENT_TYPE, ProblemTypes } from '@app/problem';
import { randomUUID } from 'node:crypto';
import { type IncomingMessage, type Server, type ServerResponse, STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { Counter, type Registry } from 'prom-client';
import type { HttpServerSettings } from './http-server.settings';

/** Headers are small and sent at once; a client that takes longer is holding the socket on purpose. */
export const HEADERS_TIMEOUT_MS = 10_000;
/**
 * How often the server looks for requests past their timeouts. Node's default
 * is 30 s, which would let a slow client keep its socket up to 30 s past the
 * limit.
 */
const CONNECTIONS_CHECK_MS = 1000;

/** Errors of a connection that is already gone or going: nothing can be answered, nothing is worth a line. */
const GONE = new Set(['ECONNRESET', 'EPIPE', 'HPE_INVALID_EOF_STATE']);

function statusFor(code: string | undefined): number {
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return 408;
  if (code === 'HPE_HEADER_OVERFLOW') return 431;
  return 400;
}

/**
 * Every app's HTTP server with explicit limits, so a slow client cannot hold a
 * socket for minutes: headers within HEADERS_TIMEOUT_MS (or the request
 * timeout, if shorter), the whole request within HTTP_REQUEST_TIMEOUT_S, idle
 * keep-alive connections closed after HTTP_KEEP_ALIVE_TIMEOUT_S.
 *
 * What Node's HTTP parser refuses itself (too slow, headers too large, not
 * HTTP) never reaches Express, so the logging and metrics middleware cannot
 * see it: it is answered here as problem+json with an X-Request-Id, logged
 * and counted in `http_parser_refusals_total{status}`.
 */
export function configureHttpServer(
  server: Server,
  settings: HttpServerSettings,
  logger: LoggerService,
  registry: Registry,
): void {
  server.requestTimeout = settings.httpRequestTimeoutMs;
  server.headersTimeout = Math.min(HEADERS_TIMEOUT_MS, settings.httpRequestTimeoutMs);
  server.keepAliveTimeout = settings.httpKeepAliveTimeoutMs;
  // A createServer option, read from the server when it starts listening (Node starts the checker then).
  (server as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval = CONNECTIONS_CHECK_MS;

  const refusals =
    (registry.getSingleMetric('http_parser_refusals_total') as Counter<'status'> | undefined) ??
    new Counter({
      name: 'http_parser_refusals_total',
      help: "Requests Node's HTTP parser refused before any route saw them: 408 too slow, 431 headers too large, 400 not HTTP",
      labelNames: ['status'],
      registers: [registry],
    });
  for (const status of ['400', '408', '431']) refusals.inc({ status }, 0);
  drainKeepAliveOnClose(server);

  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // The response of the request on this socket, if its headers were read
    // (a body that stopped arriving); Node's own default handler reads it too.
    const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse })._httpMessage;
    // Gone, or an answer already on its way (a pipelined request timed out
    // behind it): nothing more can be said, and a 408 would land inside it.
    if (GONE.has(err.code ?? '') || !socket.writable || inFlight?.headersSent) {
      socket.destroy();
      return;
    }
    const status = statusFor(err.code);
    // Its headers are parsed, but the logging middleware (after the body
    // parser) has not seen it yet: it gets its id here.
    const req = inFlight?.req;
    const id = randomUUID();
    const body = JSON.stringify({ type: ProblemTypes.http(status), title: STATUS_CODES[status], status });
    markAnsweredByServer(socket);
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nConnection: close\r\nContent-Type: ${PROBLEM_CONTENT_TYPE}\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${id}\r\n\r\n${body}`,
    );
    // Closed, not half-closed: the server's sockets allow half-open, and a
    // client that goes on sending would go on being read.
    socket.destroy();
    refusals.inc({ status: String(status) });
    logger.warn(
      { req: { id, method: req?.method, url: req?.url }, status, code: err.code },
      `request refused by the HTTP parser: ${status} ${STATUS_CODES[status]}`,
    );
  });
}

/** How often a closing server closes the keep-alive connections that have gone idle. */
const CLOSE_IDLE_EVERY_MS = 100;

const draining = new WeakSet<Server>();

/**
 * From now on, every answer of the server ends its keep-alive connection
 * (`Connection: close`), and idle connections are closed every 100 ms until
 * the server has closed: a client's next request opens a new connection,
 * which the load balancer sends to an instance that is not stopping. Called
 * by close(), and by whoever drains before it (the gateway lets its running
 * calls finish first). Node's close() alone closes only the connections idle
 * at that moment; one whose answer finishes a moment later stayed open until
 * HTTP_KEEP_ALIVE_TIMEOUT_S (65 s, which a load balancer's pooled connection
 * always reaches), and the server's close, so the process's exit, waited for
 * it, past the pod's grace period.
 */
export function beginDrain(server: Server): void {
  if (draining.has(server)) return;
  draining.add(server);
  const timer = setInterval(() => server.closeIdleConnections(), CLOSE_IDLE_EVERY_MS);
  timer.unref();
  server.once('close', () => clearInterval(timer));
}

function drainKeepAliveOnClose(server: Server): void {
  const close = server.close.bind(server);
  server.close = (callback?: (err?: Error) => void) => {
    beginDrain(server);
    return close(callback);
  };
  server.on('request', (_req: IncomingMessage, res: ServerResponse) => {
    if (draining.has(server) && !res.headersSent) res.shouldKeepAlive = false;
  });
}
