import { randomBytes } from 'node:crypto';
import type { PaymentsProvider, Payout, PayoutRequest, PayoutResult } from './payments-provider';

/** The fake's one business rule: it refuses a payout above this, so a refusal can be tried by hand. */
export const FAKE_PAYOUT_LIMIT = 1_000_000;

/**
 * The built-in provider of the quick start (PAYMENTS_URL unset), in memory.
 *
 * - One payout per reference: a second payout with a reference it knows
 *   returns the first one, as a provider that honours `Idempotency-Key` does.
 *   Real providers differ; the api must not rely on it (it looks up first).
 * - An amount above FAKE_PAYOUT_LIMIT (1,000,000 minor units) is refused
 *   with a 422 and a problem-like body; nothing is recorded.
 * - A signal aborted before the call rejects with its reason, and nothing is paid.
 */
export class FakePaymentsProvider implements PaymentsProvider {
  private readonly payouts = new Map<string, Payout>();

  async payout(request: PayoutRequest, signal: AbortSignal): Promise<PayoutResult> {
    signal.throwIfAborted();
    const known = this.payouts.get(request.reference);
    if (known !== undefined) return { outcome: 'paid', payout: { ...known } };
    if (request.amount > FAKE_PAYOUT_LIMIT) {
      return {
        outcome: 'refused',
        status: 422,
        body: {
          type: 'amount-over-limit',
          title: 'Amount over the limit',
          detail: `the fake payment provider refuses payouts above ${FAKE_PAYOUT_LIMIT} minor units`,
          reference: request.reference,
        },
      };
    }
    const payout: Payout = {
      payout_id: `po_${randomBytes(12).toString('hex')}`,
      reference: request.reference,
      order_id: request.order_id,
      amount: request.amount,
      currency: request.currency,
      status: 'paid',
      created_at: new Date().toISOString(),
    };
    this.payouts.set(request.reference, payout);
    return { outcome: 'paid', payout: { ...payout } };
  }

  async lookup(reference: string, signal: AbortSignal): Promise<Payout | undefined> {
    signal.throwIfAborted();
    const known = this.payouts.get(reference);
    return known === undefined ? undefined : { ...known };
  }
}
