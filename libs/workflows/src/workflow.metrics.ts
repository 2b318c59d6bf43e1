import { Injectable } from '@nestjs/common';
import { Counter, Histogram, Registry } from 'prom-client';
import type { DeliveryResult, EntrySource, StreamMessage } from './consumer/job-handler';
import { failureOf } from './consumer/job.errors';
import { parseStepEntry } from './wire';
import type { BegunStep } from './workflow-store';
import type { StepDefinition, WorkflowDefinition } from './workflow.registry';
import { WorkflowRegistry } from './workflow.registry';

/**
 * What one delivery of a step came to: `done` committed it, `duplicate` found
 * it committed already (earlier, or by another delivery first), `transient`
 * left it pending for a redelivery, `failed` failed the run for good.
 */
const STEP_OUTCOMES = ['done', 'duplicate', 'transient', 'failed'] as const;
export type StepOutcome = (typeof STEP_OUTCOMES)[number];
const RUN_STATUSES = ['done', 'failed'] as const;

/** One thing that happened to a step's entry, as the metrics see it. */
export type StepEvent =
  /** The delivery's begin: whether it created the run's row (the run's first step, begun for the first time). */
  | { readonly event: 'begun'; readonly runCreated: boolean }
  /** The delivery resolved with the handler's outcome (`done`: it committed the step); on the last step or not. */
  | { readonly event: 'resolved'; readonly outcome: string; readonly lastStep: boolean }
  /** The delivery threw: retryable leaves the entry pending, anything else dead-letters it. */
  | { readonly event: 'threw'; readonly retryable: boolean }
  /**
   * The entry's dead letter is written (JobHandler.afterDeadLetter). `run`: the entry names a run of a workflow
   * this worker has (a malformed one has none). `runDone`: the run was done already (the consumer's max_deliveries
   * on a last step whose ack kept failing), when known.
   */
  | { readonly event: 'dead_lettered'; readonly run: boolean; readonly runDone?: boolean };

/** What an event counts: the step's delivery outcome, its attempts (it committed), the run started or finished. */
export interface StepCounts {
  readonly step?: StepOutcome;
  readonly attempts?: true;
  readonly run?: 'started' | (typeof RUN_STATUSES)[number];
}

/**
 * The metrics' rules, from what happened to what is counted. A run finishes
 * `done` with the delivery that commits its last step (its redeliveries are
 * duplicates) and `failed` once its entry's dead letter is written, unless the
 * run was known done: a middle step committed and then dead-lettered (its
 * ack, which carries the next step's XADD, never ran) leaves the run stopped
 * there, failed in PostgreSQL too, and counts.
 */
export function stepCounts(e: StepEvent): StepCounts {
  switch (e.event) {
    case 'begun':
      return e.runCreated ? { run: 'started' } : {};
    case 'resolved':
      if (e.outcome !== 'done') return { step: 'duplicate' };
      return e.lastStep ? { step: 'done', attempts: true, run: 'done' } : { step: 'done', attempts: true };
    case 'threw':
      return { step: e.retryable ? 'transient' : 'failed' };
    case 'dead_lettered':
      return e.run && e.runDone !== true ? { run: 'failed' } : {};
  }
}

/** A delivery's workflow and step when the registry knows both (labels stay bounded: no name from an entry else). */
interface Labelled {
  readonly workflow: WorkflowDefinition;
  readonly step: StepDefinition | undefined;
  readonly last: boolean;
}

/**
 * The figures of each workflow and step, beside the consumer's per-delivery
 * ones (WorkerMetrics). Labels are the registry's workflow and step names
 * only, every series present from 0 at start (a series first seen at 1 has no
 * increase(), so the first failed run of a fresh pod would not alert). A run
 * re-driven after it failed finishes again: finished runs can outnumber
 * started ones, and a run refused before its first begin (invalid input)
 * fails without having started.
 */
@Injectable()
export class WorkflowMetrics {
  readonly runsStarted: Counter<'workflow'>;
  readonly runsFinished: Counter<'workflow' | 'status'>;
  readonly stepDuration: Histogram<'workflow' | 'step' | 'outcome'>;
  readonly stepAttempts: Histogram<'workflow' | 'step'>;
  /** A delivery's step row's attempts, from its begin, for when the delivery commits. */
  private readonly attempts = new WeakMap<StreamMessage, number>();

  constructor(
    registry: Registry,
    private readonly workflows: WorkflowRegistry,
  ) {
    const registers = [registry];
    this.runsStarted = new Counter({
      name: 'workflow_runs_started_total',
      help: 'Runs whose first step began for the first time (the run row created)',
      labelNames: ['workflow'],
      registers,
    });
    this.runsFinished = new Counter({
      name: 'workflow_runs_finished_total',
      help: 'Runs finished: done (the last step committed) or failed (a step dead-lettered)',
      labelNames: ['workflow', 'status'],
      registers,
    });
    this.stepDuration = new Histogram({
      name: 'workflow_step_duration_seconds',
      help: 'One delivery of a step, from its start to its outcome: done, duplicate, transient, failed',
      labelNames: ['workflow', 'step', 'outcome'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120],
      registers,
    });
    this.stepAttempts = new Histogram({
      name: 'workflow_step_attempts',
      help: "The step row's attempts when it commits, re-drives included",
      labelNames: ['workflow', 'step'],
      buckets: [1, 2, 3, 4, 5, 6, 8, 10],
      registers,
    });
    for (const w of workflows.workflows) {
      this.runsStarted.inc({ workflow: w.name }, 0);
      for (const status of RUN_STATUSES) this.runsFinished.inc({ workflow: w.name, status }, 0);
      for (const s of w.steps) {
        for (const outcome of STEP_OUTCOMES) this.stepDuration.zero({ workflow: w.name, step: s.name, outcome });
        this.stepAttempts.zero({ workflow: w.name, step: s.name });
      }
    }
  }

  /**
   * Times one delivery (`deliver`, WorkflowHandler's) and counts what it came
   * to; the delivery that commits a run's last step finishes the run `done`.
   */
  async delivery<T extends DeliveryResult>(
    message: StreamMessage,
    source: EntrySource,
    deliver: () => Promise<T>,
  ): Promise<T> {
    const startedAt = performance.now();
    let event: StepEvent = { event: 'threw', retryable: false };
    try {
      const result = await deliver();
      event = { event: 'resolved', outcome: result.outcome, lastStep: this.labelled(message, source)?.last ?? false };
      return result;
    } catch (err) {
      event = { event: 'threw', retryable: failureOf(err).retryable };
      throw err;
    } finally {
      this.count(message, source, stepCounts(event), (performance.now() - startedAt) / 1000);
    }
  }

  /** What the delivery's begin found: whether it started the run, and the attempts if it commits. */
  begun(message: StreamMessage, source: EntrySource, begun: Pick<BegunStep, 'runCreated' | 'attempts'>): void {
    this.attempts.set(message, begun.attempts);
    this.count(message, source, stepCounts({ event: 'begun', runCreated: begun.runCreated }));
  }

  /**
   * The entry's dead letter is written (JobHandler.afterDeadLetter, once the
   * consumer's MULTI has run: a MULTI that failed leaves the entry pending and
   * counts nothing). `runDone`: see StepEvent. A malformed entry has no run.
   */
  deadLettered(message: StreamMessage, source: EntrySource, runDone?: boolean): void {
    let run = true;
    try {
      parseStepEntry(message.fields);
    } catch {
      run = false;
    }
    this.count(message, source, stepCounts({ event: 'dead_lettered', run, runDone }));
  }

  private count(message: StreamMessage, source: EntrySource, counts: StepCounts, seconds?: number): void {
    const at = this.labelled(message, source);
    if (!at) return;
    const workflow = at.workflow.name;
    if (counts.run === 'started') this.runsStarted.inc({ workflow });
    else if (counts.run) this.runsFinished.inc({ workflow, status: counts.run });
    // A step name not registered has no step series.
    if (!at.step) return;
    const labels = { workflow, step: at.step.name };
    if (counts.step && seconds !== undefined) this.stepDuration.observe({ ...labels, outcome: counts.step }, seconds);
    const attempts = this.attempts.get(message);
    if (counts.attempts && attempts !== undefined) this.stepAttempts.observe(labels, attempts);
  }

  /**
   * The entry's workflow and step as the handler resolves them (wire.ts: `workflow` absent, the queue's one
   * workflow; `step` absent, the first), when the queue's workflows hold them: a step name not registered has
   * no step series (its run still fails under its workflow).
   */
  private labelled(message: StreamMessage, source: EntrySource): Labelled | undefined {
    const { workflow: named, step: stepName } = message.fields;
    const queue = this.workflows.queue(source.queue);
    if (!queue) return undefined;
    const workflow =
      named !== undefined
        ? queue.workflows.get(named)
        : queue.workflows.size === 1
          ? [...queue.workflows.values()][0]
          : undefined;
    if (!workflow) return undefined;
    const index = stepName === undefined ? 0 : workflow.steps.findIndex((s) => s.name === stepName);
    return { workflow, step: workflow.steps[index], last: index === workflow.steps.length - 1 };
  }
}
