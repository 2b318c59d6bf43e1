import { env } from '@app/config';

/** What an operator may tune of every app's HTTP server (docs/operations.md, Configuration). */
export const httpServerEnv = {
  /** The whole request, headers and body, must arrive within this (Node's default: 300 s). */
  httpRequestTimeoutMs: env.secondsAsMs('HTTP_REQUEST_TIMEOUT_S', 30, { min: 1, max: 3600 }),
  /**
   * An idle keep-alive connection is closed after this (Node's default: 5 s).
   * Above a load balancer's own idle timeout (60 s on most), so the balancer
   * never sends a request down a connection the server is closing.
   */
  httpKeepAliveTimeoutMs: env.secondsAsMs('HTTP_KEEP_ALIVE_TIMEOUT_S', 65, { min: 1, max: 3600 }),
};

/** The server's settings, as every app's configuration has them. */
export interface HttpServerSettings {
  readonly httpRequestTimeoutMs: number;
  readonly httpKeepAliveTimeoutMs: number;
}
