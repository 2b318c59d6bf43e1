import { env } from '@app/config';

/** What an operator may tune of every app's HTTP server (docs/operations.md, Configuration). */
export const httpServerEnv = {
  /** The whole request, headers and body, must arrive within this (Node's default: 300 s). */
  httpRequestTimeoutMs: env.secondsAsMs(
    'HTTP_REQUEST_TIMEOUT_S',
    30,
    { min: 1, max: 3600 },
    {
      describe:
        'a request (headers and body) must arrive within this, its headers within 10 s (or this, if shorter); ' +
        'a slower one is answered `408` and its connection closed. ' +
        "Answers may take longer: this bounds the client's sending, not our handling",
    },
  ),
  /**
   * An idle keep-alive connection is closed after this (Node's default: 5 s).
   * Above a load balancer's own idle timeout (60 s on most), so the balancer
   * never sends a request down a connection the server is closing.
   */
  httpKeepAliveTimeoutMs: env.secondsAsMs(
    'HTTP_KEEP_ALIVE_TIMEOUT_S',
    65,
    { min: 1, max: 3600 },
    {
      describe:
        "an idle keep-alive connection is closed after this; keep it above your load balancer's idle timeout " +
        "(60 s on AWS ALB and most others, 600 s on Google Cloud's), or the balancer may send a request down " +
        'a connection the server is closing, and get a 502',
    },
  ),
};

/** The server's settings, as every app's configuration has them. */
export interface HttpServerSettings {
  readonly httpRequestTimeoutMs: number;
  readonly httpKeepAliveTimeoutMs: number;
}
