import type { ErrorClass } from '@app/llm';
import { RetryError } from './retry/retry.errors';
import { NonRetryableStepError } from './workflow.errors';
import { isDeterministicDatabaseError, isTransientDatabaseError } from './database-errors';

/*
 * The engine's decisions, as pure functions of the facts a delivery has
 * (the step's row after `begin`, the delivery count, the run's age, the
 * error's class): WorkflowHandler does the I/O around them once.
 */

/**
 * A step's row as `begin` left it: `done` was committed by an earlier delivery; `busy`: another delivery holds its
 * run (a step in its own transaction, a commit) and decides; `failed`: its run was failed by another delivery (and
 * dead-lettered) and this entry is no re-drive; any other is now `running`.
 */
export type StepRowStatus = 'running' | 'done' | 'busy' | 'failed';

export interface DeliveryFacts {
  readonly step: StepRowStatus;
  /** This delivery's number (1 first), as Redis counts it. */
  readonly delivery: number;
  readonly maxDeliveries: number;
  /** Since the run's row was created (its first delivery), by PostgreSQL's clock. */
  readonly runAgeMs: number;
  /** The workflow's deadline (`deadlineS`), if it has one. */
  readonly deadlineMs?: number;
}

export type DeliveryDecision =
  /** Run the step; `timeLeftMs`: what the run's deadline leaves it (Infinity: no deadline). */
  | { readonly action: 'run'; readonly timeLeftMs: number }
  /** Committed already: do not run it, go on with its recorded output (schedule the next step, ack). */
  | { readonly action: 'advance' }
  /** Fail the run and dead-letter the entry. */
  | { readonly action: 'fail'; readonly failure: ErrorClass }
  /** Ack the entry without running it: its run failed, decided by another delivery (only a re-drive revives it). */
  | { readonly action: 'drop' }
  /** Leave the entry pending, changing nothing: another delivery is at work on the run. */
  | { readonly action: 'retry'; readonly failure: ErrorClass };

export const DEADLINE: ErrorClass = { kind: 'deadline', retryable: false };
export const MAX_DELIVERIES: ErrorClass = { kind: 'max_deliveries', retryable: false };
export const RUNNING_ELSEWHERE: ErrorClass = { kind: 'running_elsewhere', retryable: true };

/** What one delivery of a step does, given its row after `begin`. */
export function decideDelivery(f: DeliveryFacts): DeliveryDecision {
  // A committed step is never run again, whatever else holds: its redelivery only finishes what the crash cut short.
  if (f.step === 'done') return { action: 'advance' };
  if (f.step === 'failed') return { action: 'drop' };
  if (f.step === 'busy') return { action: 'retry', failure: RUNNING_ELSEWHERE };
  if (f.delivery > f.maxDeliveries) return { action: 'fail', failure: MAX_DELIVERIES };
  const timeLeftMs = f.deadlineMs === undefined ? Infinity : f.deadlineMs - f.runAgeMs;
  if (timeLeftMs <= 0) return { action: 'fail', failure: DEADLINE };
  return { action: 'run', timeLeftMs };
}

/** What a delivery is, before anything is read of its run. */
export interface UnbegunFacts {
  /** This delivery's number (1 first). */
  readonly delivery: number;
  /** The entry was put back by a re-drive. */
  readonly redriven: boolean;
  /** The step's place in its workflow (0 first). */
  readonly stepIndex: number;
  /** The workflow's deadline, if it has one. */
  readonly deadlineMs?: number;
}

/**
 * Whether a delivery runs its step before any `begin`, its commit writing the
 * run's and the step's rows at once: a run's first step on its first
 * delivery, not re-driven, of a workflow without a deadline. Nothing else can
 * hold such a run yet but a delivery of another entry of it, which the
 * commit's guard (the run's row) settles; `begin` would only have written two
 * rows that the commit writes again, a statement and four row writes per job
 * (docs/benchmarks.md). A deadline counts from the run's `begin`, so a
 * workflow with one begins before it runs; a redelivery, and any later step,
 * reads its run's row first (done, failed, busy, past its deadline).
 */
export function runsUnbegun(f: UnbegunFacts): boolean {
  return f.delivery === 1 && !f.redriven && f.stepIndex === 0 && f.deadlineMs === undefined;
}

/** Where an error came from: the step's own code (its model calls included), or the engine's commit. */
export type FailurePhase = 'step' | 'commit';

export interface FailureFacts {
  readonly phase: FailurePhase;
  /** The run's deadline has passed. */
  readonly deadlinePassed: boolean;
  /** The step's signal fired: its timeout, or the worker's drain time over. */
  readonly aborted: boolean;
}

/**
 * What a failed delivery comes to: retryable leaves the entry pending for a
 * redelivery, anything else fails the run and dead-letters the entry with
 * `kind` as its reason. A step's own verdict (NonRetryableStepError) stands;
 * past the run's deadline nothing is retried; a model call's RetryError
 * keeps its class.
 *
 * In the step: PostgreSQL being away (a SQLSTATE or its driver's error, never
 * a message that happens to say "connect") is worth a redelivery; a step cut
 * off by its timeout (or a drain) is redelivered; anything else is a bug
 * (`unexpected`).
 *
 * In the commit (and begin): the outcome of a statement that failed is often
 * unknown (a connection lost as COMMIT went out), and a redelivery is safe
 * (begin finds the step done and advances), so everything is retried but the
 * errors a statement run alone gets every time (SQLSTATE classes 22, 23, 42;
 * the commit batch re-runs a failed step alone before it says so).
 */
export function decideFailure(err: unknown, f: FailureFacts): ErrorClass {
  if (err instanceof NonRetryableStepError) return { kind: err.reason, retryable: false };
  if (f.deadlinePassed) return DEADLINE;
  if (err instanceof RetryError) return err.failure;
  if (f.phase === 'commit') return { kind: 'database', retryable: !isDeterministicDatabaseError(err) };
  if (isTransientDatabaseError(err, true)) return { kind: 'database', retryable: true };
  if (f.aborted) return { kind: 'step_timeout', retryable: true };
  return { kind: 'unexpected', retryable: false };
}

/**
 * A permanent failure's dead-letter detail, beside its reason (`failure.kind`):
 * an error that named its own kind (a RetryError's class, a step's
 * NonRetryableStepError reason) keeps its message as it is, as dead letters
 * always said it; one the engine classified itself (a bug, a deadline, the
 * commit) gets the kind first, so the detail says what the engine made of it.
 */
export function failureDetail(err: unknown, failure: ErrorClass): string {
  const message = err instanceof Error ? err.message : String(err);
  const own =
    err instanceof RetryError ? err.failure.kind : err instanceof NonRetryableStepError ? err.reason : undefined;
  return own === failure.kind ? message : `${failure.kind}: ${message}`;
}
