import { Injectable } from '@nestjs/common';
import { Counter, Registry } from 'prom-client';

export const REFUND_OUTCOMES = ['paid', 'found', 'refused', 'unknown'] as const;
export type RefundOutcome = (typeof REFUND_OUTCOMES)[number];

export const PROVIDER_CALL_RESULTS = {
  payout: ['paid', 'refused', 'unknown'],
  lookup: ['found', 'absent', 'unknown'],
} as const;

/**
 * The refunds route's figures, beside the idempotency layer's own (replays,
 * conflicts): what each refund run came to, and what the payment provider
 * answered. `unknown` that keeps rising is a provider that does not answer;
 * `found` counts payouts that only a lookup could settle.
 */
@Injectable()
export class RefundMetrics {
  private readonly refunds: Counter<'outcome'>;
  private readonly calls: Counter<'call' | 'result'>;

  constructor(registry: Registry) {
    this.refunds = new Counter({
      name: 'refunds_total',
      help: 'Runs of POST /v1/refunds that reached the provider, by outcome: paid (a payout made and recorded), found (a payout found by lookup and recorded), refused (422), unknown (503: the outcome is not known yet)',
      labelNames: ['outcome'],
      registers: [registry],
    });
    this.calls = new Counter({
      name: 'refund_provider_calls_total',
      help: 'Calls to the payment provider: call=payout (paid, refused, unknown) and call=lookup (found, absent, unknown)',
      labelNames: ['call', 'result'],
      registers: [registry],
    });
    for (const outcome of REFUND_OUTCOMES) this.refunds.inc({ outcome }, 0);
    for (const [call, results] of Object.entries(PROVIDER_CALL_RESULTS))
      for (const result of results) this.calls.inc({ call, result }, 0);
  }

  refund(outcome: RefundOutcome): void {
    this.refunds.inc({ outcome });
  }

  payout(result: (typeof PROVIDER_CALL_RESULTS.payout)[number]): void {
    this.calls.inc({ call: 'payout', result });
  }

  lookup(result: (typeof PROVIDER_CALL_RESULTS.lookup)[number]): void {
    this.calls.inc({ call: 'lookup', result });
  }
}
