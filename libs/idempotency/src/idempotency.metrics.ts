import { Injectable, Optional } from '@nestjs/common';
import { Counter, Registry } from 'prom-client';

export type IdempotencyOutcome =
  | 'new'
  | 'replayed'
  | 'in_progress'
  | 'mismatch'
  | 'key_invalid'
  | 'store_unavailable'
  | 'lock_lost'
  | 'released'
  | 'not_stored';

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
  }

  count(outcome: IdempotencyOutcome): void {
    this.outcomes.inc({ outcome });
  }
}
