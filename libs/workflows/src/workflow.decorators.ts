import type { Type } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { WORKFLOWS_QUEUE } from './operations/operated-queues';

/** A workflow's options, as `@Workflow(name, options)` declares them. */
export interface WorkflowOptions {
  /**
   * The queue its runs go to (`{<queue>}:jobs`); default `workflows`, which
   * workflows share (their entries then name the workflow).
   */
  readonly queue?: string;
  /** The consumer group on that queue; default: the queue's name. */
  readonly group?: string;
  /** A class-validator DTO: a run whose input fails it is dead-lettered `invalid_input`, never run. */
  readonly input?: Type<object>;
  /**
   * Reads the run's input (its entry's `payload`, JSON-parsed) into what the
   * steps get as `ctx.input`, or throws: an entry whose input it refuses is
   * dead-lettered `malformed`, with what it threw as the detail, before any
   * work on the run (no pre-check, no run or step row, no step). For a wire
   * format with a parser of its own (summaries': `parseSummaryJobPayload`).
   * With `input` too, the class validates what it returns.
   */
  readonly parse?: (payload: unknown) => unknown;
  /** The run's deadline, from its first delivery: past it, the run fails (`deadline`). Default: none. */
  readonly deadlineS?: number;
}

export interface WorkflowMetadata extends WorkflowOptions {
  readonly name: string;
}

export interface StepOptions {
  /** The step's name; default: the method's. */
  readonly name?: string;
  /** How long one delivery of the step may run; default: the worker's JOB_BUDGET_S. */
  readonly timeoutS?: number;
}

/** Read by the explorer; the public decorators below are what a workflow class uses. */
export const WorkflowMetadataDecorator = Reflector.createDecorator<WorkflowMetadata>();
export const StepMetadataDecorator = Reflector.createDecorator<StepOptions>();

/** The queue workflows share unless they name their own. */
export const DEFAULT_QUEUE = WORKFLOWS_QUEUE;

/**
 * Declares a provider class a workflow named `name`, whose `@Step()` methods,
 * in declaration order, are its steps (the shape of @nestjs/bullmq's
 * `@Processor`). The class must also be a provider (`@Injectable()`, listed in
 * `WorkflowsModule.forWorker({ workflows })` or any module's providers).
 */
export function Workflow(name: string, options: WorkflowOptions = {}): ClassDecorator {
  return WorkflowMetadataDecorator({ name, ...options });
}

/** Declares a method a step of its class's workflow. */
export function Step(options: StepOptions = {}): MethodDecorator {
  return StepMetadataDecorator(options);
}

/**
 * Optional on a `@Workflow()` class whose runs may have finished without the
 * engine's record: a workflow ported onto the engine whose earlier runs left
 * their own proof of being done (summaries: its row in `summaries`). Asked
 * before `begin`, once for each batch the consumer reads (one query), and by
 * a delivery alone when that failed; a run it names is acked as a duplicate,
 * never run. With one id it may ask the cheaper way.
 */
export interface FinishedElsewhere {
  finishedAmong(runIds: readonly string[]): Promise<ReadonlySet<string>>;
}

export function hasFinishedElsewhere(host: object): host is FinishedElsewhere {
  return typeof (host as Partial<FinishedElsewhere>).finishedAmong === 'function';
}
