/** One payout to ask the provider for: a refund's money going back. */
export interface PayoutRequest {
  /** The refund id: the payout's reference and its `Idempotency-Key`. */
  readonly reference: string;
  readonly order_id: string;
  /** Integer minor units (cents). */
  readonly amount: number;
  /** Three capital letters (ISO 4217). */
  readonly currency: string;
}

/** A payout as the provider describes it; fields beyond these two are the provider's own. */
export interface Payout {
  payout_id: string;
  reference: string;
  [k: string]: unknown;
}

/** A payout's known outcome. Anything else is a thrown PaymentOutcomeUnknownError. */
export type PayoutResult =
  | { readonly outcome: 'paid'; readonly payout: Payout }
  /** A 4xx other than 408/409/425/429: the provider said no, and no money moved. */
  | { readonly outcome: 'refused'; readonly status: number; readonly body: unknown };

export type PaymentOutcomeUnknownReason = 'timeout' | 'connection' | 'status';

/**
 * The provider may or may not have made the payout: no answer in time, a
 * connection that broke, or an answer that settles nothing (a 5xx, 408, 409,
 * 425, 429, a 2xx without a payout id, a body that cannot be read). The
 * caller must look the reference up before it pays again.
 */
export class PaymentOutcomeUnknownError extends Error {
  override readonly name = 'PaymentOutcomeUnknownError';

  constructor(
    readonly reason: PaymentOutcomeUnknownReason,
    message: string,
    readonly status?: number,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/**
 * The payment provider. Both calls throw PaymentOutcomeUnknownError when the
 * answer settles nothing, and the signal's reason, untouched, when the signal
 * was aborted before anything was sent (then nothing reached the provider).
 *
 * Providers differ in whether they honour `Idempotency-Key`: a second payout
 * with a reference may be a second payout. Look up before paying again.
 */
export interface PaymentsProvider {
  payout(request: PayoutRequest, signal: AbortSignal): Promise<PayoutResult>;
  /** The payout with that reference, or undefined when the provider knows none. */
  lookup(reference: string, signal: AbortSignal): Promise<Payout | undefined>;
}

export const PaymentsProvider = Symbol('PaymentsProvider');

/** Statuses that say "try again later", not "no": the payout may still happen or have happened. */
export const UNSETTLED_CLIENT_STATUSES: ReadonlySet<number> = new Set([408, 409, 425, 429]);

/** True for a status the provider uses to refuse a payout (nothing was paid). */
export function isRefusal(status: number): boolean {
  return status >= 400 && status < 500 && !UNSETTLED_CLIENT_STATUSES.has(status);
}

/**
 * The payout in a provider's 2xx/200 body, or undefined when there is none: not an
 * object, no string `payout_id`, or a `reference` other than the one asked for
 * (a missing one is taken to be it).
 */
export function payoutFrom(body: unknown, reference: string): Payout | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const fields = body as Record<string, unknown>;
  if (typeof fields.payout_id !== 'string' || fields.payout_id === '') return undefined;
  if (fields.reference !== undefined && fields.reference !== reference) return undefined;
  return { ...fields, payout_id: fields.payout_id, reference };
}
