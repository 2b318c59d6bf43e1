export interface GatewayOptions {
  /** The longest one upstream call (a whole stream) may take. */
  readonly timeoutMs: number;
  /** On SIGTERM, how long running calls get to finish before they are cut. */
  readonly drainMs: number;
  /** The tenants of API_KEYS: the bounded label set of the token counter. */
  readonly tenants: readonly string[];
  /** How long the gateway's own records (pins, responses) are kept: IDEMPOTENCY_RESULT_TTL_S, as long as a record. */
  readonly recordTtlMs: number;
}

export const GATEWAY_OPTIONS = 'gateway:options';

/** After a shutdown cuts the running calls, how long they get to free their keys and end their callers' streams. */
export const GATEWAY_SETTLE_MS = 2000;
