/** What the refunds route is configured with (PAYMENTS_URL, PAYMENTS_TIMEOUT_S). */
export interface RefundsOptions {
  /** The payment provider's base URL; undefined: the built-in fake provider. */
  readonly paymentsUrl: string | undefined;
  /** The longest one call to the provider may take. */
  readonly paymentsTimeoutMs: number;
  /** NODE_ENV=production: the built-in fake is then announced loudly at start-up. */
  readonly production?: boolean;
}

export const REFUNDS_OPTIONS = Symbol('REFUNDS_OPTIONS');
