import type { Request } from 'express';
import type { Attempt, InProgress } from './attempt';
import { type IdempotencyRequestOutcome, setIdempotencyOutcome } from './idempotency-context';
import { IdempotencyInProgressException, IdempotencyKeyReusedException } from './idempotency.errors';
import { IdempotencyMetrics } from './idempotency.metrics';
import { type HandlerDurations, retryAfterSeconds } from './retry-after';

/** What became of a keyed request, counted and set on it for its log line; and the two refusals a duplicate gets. */
export class RequestOutcomes {
  constructor(
    private readonly metrics: IdempotencyMetrics,
    private readonly durations: HandlerDurations,
  ) {}

  set(req: Request, outcome: IdempotencyRequestOutcome): void {
    this.metrics.count(outcome);
    setIdempotencyOutcome(req, outcome);
  }

  /** A duplicate of a running request: 409, with when to come back. */
  inProgress(req: Request, claim: InProgress, attempt: Attempt): never {
    this.set(req, 'in_progress');
    throw new IdempotencyInProgressException(retryAfterSeconds(claim, this.durations.typical(attempt.handler)));
  }

  /** The key with another body: 422. */
  mismatch(req: Request): never {
    this.set(req, 'mismatch');
    throw new IdempotencyKeyReusedException();
  }
}
