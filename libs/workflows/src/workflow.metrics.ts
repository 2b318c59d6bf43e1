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
type StepOutcome = (typeof STEP_OUTCOMES)[number];
const RUN_STATUSES = ['done', 'failed'] as const;

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
      help: "A step's deliveries (its row's attempts) when it commits",
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
    let outcome: StepOutcome = 'failed';
    try {
      const result = await deliver();
      outcome = result.outcome === 'done' ? 'done' : 'duplicate';
      return result;
    } catch (err) {
      outcome = failureOf(err).retryable ? 'transient' : 'failed';
      throw err;
    } finally {
      this.delivered(message, source, outcome, (performance.now() - startedAt) / 1000);
    }
  }

  /** What the delivery's begin found: whether it started the run, and the attempts if it commits. */
  begun(message: StreamMessage, source: EntrySource, begun: Pick<BegunStep, 'runCreated' | 'attempts'>): void {
    this.attempts.set(message, begun.attempts);
    if (!begun.runCreated) return;
    const at = this.labelled(message, source);
    if (at) this.runsStarted.inc({ workflow: at.workflow.name });
  }

  /**
   * The entry is being dead-lettered: its run failed (whoever decided it, the
   * handler or the consumer). Counted as the consumer builds the dead-letter
   * MULTI: if that MULTI fails, the entry comes back and is counted again
   * when it is dead-lettered (rare, and an over-count, never a miss). A
   * malformed entry has no run to count.
   */
  deadLettered(message: StreamMessage, source: EntrySource): void {
    try {
      parseStepEntry(message.fields);
    } catch {
      return;
    }
    const at = this.labelled(message, source);
    if (at) this.runsFinished.inc({ workflow: at.workflow.name, status: 'failed' });
  }

  private delivered(message: StreamMessage, source: EntrySource, outcome: StepOutcome, seconds: number): void {
    const at = this.labelled(message, source);
    if (!at?.step) return;
    const labels = { workflow: at.workflow.name, step: at.step.name };
    this.stepDuration.observe({ ...labels, outcome }, seconds);
    if (outcome !== 'done') return;
    const attempts = this.attempts.get(message);
    if (attempts !== undefined) this.stepAttempts.observe(labels, attempts);
    if (at.last) this.runsFinished.inc({ workflow: at.workflow.name, status: 'done' });
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
