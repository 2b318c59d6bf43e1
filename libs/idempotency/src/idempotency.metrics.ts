import { Injectable, Optional } from '@nestjs/common';
import { Counter, Registry } from 'prom-client';

export const IDEMPOTENCY_OUTCOMES = [
  'new',
  'replayed',
  'attached',
  'recovered',
  'in_progress',
  'mismatch',
  'key_invalid',
  'store_unavailable',
  'lock_lost',
  'released',
  'not_stored',
] as const;
export type IdempotencyOutcome = (typeof IDEMPOTENCY_OUTCOMES)[number];

/** Counts what the interceptor decided; registered in the app's registry when there is one. */
@Injectable()
export class IdempotencyMetrics {
  private readonly outcomes: Counter<'outcome'>;

  constructor(@Optional() registry?: Registry) {
    this.outcomes = new Counter({
      name: 'idempotency_requests_total',
      help: 'Requests to @Idempotent() routes by what the idempotency layer did with them',
      labelNames: ['outcome'],
      registers: registry ? [registry] : [],
    });
    // Every outcome from 0, so the first lock_lost or store_unavailable of a
    // fresh pod is an increase() an alert can see, not a series appearing at 1.
    for (const outcome of IDEMPOTENCY_OUTCOMES) this.outcomes.inc({ outcome }, 0);
  }

  count(outcome: IdempotencyOutcome): void {
    this.outcomes.inc({ outcome });
  }
}
