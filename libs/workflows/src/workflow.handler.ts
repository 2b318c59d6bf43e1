import { Inject, Injectable, Logger, type OnApplicationBootstrap } from '@nestjs/common';
import { InjectLlmClient, type ErrorClass, type LlmClient, type TenantTokenLimiter } from '@app/llm';
import { plainToInstance } from 'class-transformer';
import { validate, type ValidationError } from 'class-validator';
import type { ChainableCommander } from 'ioredis';
import {
  decideDelivery,
  decideFailure,
  type FailurePhase,
  failureDetail,
  RUNNING_ELSEWHERE,
  runsUnbegun,
} from './decide';
import {
  type DeliveryResult,
  type EntrySource,
  type JobHandler,
  type JobRunContext,
  type StreamMessage,
} from './consumer/job-handler';
import { HandBackError, JobError, MALFORMED } from './consumer/job.errors';
import { InjectStreamsConsumerOptions, type StreamsConsumerOptions } from './consumer/streams-consumer.options';
import type { QueuePartition } from './queue-layout';
import { RetryPolicy } from './retry/retry-policy.service';
import { RetryError } from './retry/retry.errors';
import { markRunFailed, noteTokenWait } from './run-record';
import { InjectRedis, type RedisClient } from '@app/redis';
import { activeTraceparent, inSpan } from '@app/tracing';
import { JOB_RECORD_TTL_MS } from './run-ids';
import { StepContextImpl } from './step-context';
import {
  isPlainObject,
  MalformedEntryError,
  nextStepEntry,
  parseStepEntry,
  type StepEntry,
  stepEntryFields,
  stepEntryRun,
  STEP_ENTRY_FIELDS,
} from './wire';
import type { StepDefinition, WorkflowDefinition, WorkflowQueue } from './workflow.registry';
import { hasFinishedElsewhere } from './workflow.decorators';
import { WorkflowRegistry } from './workflow.registry';
import {
  type BegunStep,
  type CommitOutcome,
  type StepCommit,
  type StepTransaction,
  WorkflowStore,
} from './workflow-store';
import { WorkerMetrics } from './worker.metrics';
import { WorkflowMetrics } from './workflow.metrics';
import { STEP_TOKEN_LIMITER } from './workflows.options';

/** A delivery's step, resolved: its queue's partition, workflow and step, the entry and its validated input. */
interface Resolved {
  readonly partition: QueuePartition;
  readonly workflow: WorkflowDefinition;
  readonly step: StepDefinition;
  readonly index: number;
  readonly entry: StepEntry;
  readonly input: unknown;
}

/** What failing a run needs: a resolved delivery, or an entry refused while it was being resolved. */
type Failing = Pick<Resolved, 'workflow' | 'entry' | 'step'> &
  Partial<Pick<Attempt, 'source' | 'delivery' | 'unbegun'>>;

/** A resolved delivery, and whether its step runs before any begin (`runsUnbegun`) until something begins it. */
interface Attempt extends Resolved {
  readonly source: EntrySource;
  readonly delivery: number;
  unbegun: boolean;
}

const UNKNOWN_WORKFLOW: ErrorClass = { kind: 'unknown_workflow', retryable: false };
const UNKNOWN_STEP: ErrorClass = { kind: 'unknown_step', retryable: false };
const INVALID_INPUT: ErrorClass = { kind: 'invalid_input', retryable: false };

/** The step's timeout (or the run's deadline, or the delivery budget) ran out. */
class StepTimeoutError extends Error {
  constructor(ms: number) {
    super(`the step ran out of its ${Math.round(ms)} ms`);
    this.name = 'StepTimeoutError';
  }
}

/** class-validator's messages, one per failed constraint, nested properties by their path. */
function messagesOf(errors: readonly ValidationError[], path = ''): string[] {
  return errors.flatMap((e) => {
    const at = path ? `${path}.${e.property}` : e.property;
    return [...Object.values(e.constraints ?? {}), ...messagesOf(e.children ?? [], at)];
  });
}

/**
 * One delivery of a workflow step (JobHandler): parse the entry (wire.ts),
 * `begin` (batched), then by decideDelivery: run the step and commit it
 * (group-committed), or take the recorded output of a step committed
 * earlier; and resolve with the next step's XADD for the consumer's ack
 * MULTI, so the next step is scheduled exactly when this entry leaves the
 * stream. A failure is classified by decideFailure: retryable leaves the
 * entry pending; anything else marks the step and run failed in PostgreSQL
 * and the consumer dead-letters the entry (deadLettered marks the run's
 * record failed in the same MULTI; afterDeadLetter counts the run failed).
 */
@Injectable()
export class WorkflowHandler implements JobHandler, OnApplicationBootstrap {
  private readonly logger = new Logger(WorkflowHandler.name);
  /** Entries whose run this handler marked failed in PostgreSQL already (the consumer's own dead letters are not). */
  private readonly failedInStore = new WeakSet<StreamMessage>();
  /** Entries refused before their run began (the workflow's `parse` said malformed): no run to mark or count. */
  private readonly refused = new WeakSet<StreamMessage>();
  /** A batch's FinishedElsewhere answer, by the entry it was asked for: undefined means unknown (ask alone). */
  private readonly prechecked = new WeakMap<StreamMessage, Promise<boolean | undefined>>();
  /**
   * Whether a first step's entry has its run recorded in PostgreSQL already (a batch's one read): only `false`
   * lets it run unbegun; unknown (not asked, or the read failed) begins, as any delivery may.
   */
  private readonly runRecorded = new WeakMap<StreamMessage, Promise<boolean | undefined>>();

  constructor(
    private readonly registry: WorkflowRegistry,
    private readonly store: WorkflowStore,
    private readonly retry: RetryPolicy,
    @InjectLlmClient() private readonly llm: LlmClient,
    private readonly metrics: WorkerMetrics,
    @InjectStreamsConsumerOptions() private readonly options: StreamsConsumerOptions,
    private readonly workflowMetrics: WorkflowMetrics,
    @Inject(STEP_TOKEN_LIMITER) private readonly tokens: TenantTokenLimiter | null,
    @InjectRedis() private readonly redis: RedisClient,
  ) {}

  /**
   * A step's timeout past the delivery budget (JOB_BUDGET_S) never applies: the budget cuts the step off first.
   * Warned, not refused: the budget is the deployment's to set, and the step still runs within it.
   */
  onApplicationBootstrap(): void {
    for (const w of this.registry.workflows)
      for (const s of w.steps)
        if (s.timeoutMs !== undefined && s.timeoutMs > this.options.jobBudgetMs)
          this.logger.warn(
            `step ${s.name} of workflow ${w.name}: its timeoutS (${s.timeoutMs / 1000} s) is past JOB_BUDGET_S ` +
              `(${this.options.jobBudgetMs / 1000} s), which cuts it off first`,
          );
  }

  process(message: StreamMessage, ctx: JobRunContext): Promise<DeliveryResult> {
    return this.workflowMetrics.delivery(message, ctx.source, () => this.deliver(message, ctx));
  }

  private async deliver(message: StreamMessage, ctx: JobRunContext): Promise<DeliveryResult> {
    const resolved = await this.resolve(message, ctx.source);
    const { entry, workflow } = resolved;
    const redriven = entry.redriven === true;
    const r: Attempt = {
      ...resolved,
      source: ctx.source,
      delivery: ctx.delivery,
      unbegun:
        runsUnbegun({ delivery: ctx.delivery, redriven, stepIndex: resolved.index, deadlineMs: workflow.deadlineMs }) &&
        (await this.runRecorded.get(message)) === false,
    };
    const host = workflow.instance();
    if (hasFinishedElsewhere(host)) {
      const finished =
        (await this.prechecked.get(message)) ??
        (await this.guard(message, r, 'commit', async () =>
          (await host.finishedAmong([entry.runId])).has(entry.runId),
        ));
      if (finished) return { outcome: 'duplicate' };
    }
    // The first step's first delivery runs at once: its commit writes its run's row and its own (runsUnbegun).
    if (r.unbegun) return this.run(message, r, ctx, Infinity);
    const begun = await this.begin(message, r);
    const decision = decideDelivery({
      step: begun.status,
      delivery: ctx.delivery,
      maxDeliveries: this.options.maxDeliveries,
      runAgeMs: begun.runAgeMs,
      deadlineMs: workflow.deadlineMs,
    });
    // Its run failed by another delivery, which dead-lettered it: acked, not run, nothing scheduled.
    if (decision.action === 'drop') return { outcome: 'duplicate' };
    if (decision.action === 'retry')
      throw new HandBackError(`${decision.failure.kind}: step ${r.step.name} of run ${entry.runId}`, decision.failure);
    if (decision.action === 'fail') {
      await this.failRun(message, r, decision.failure.kind);
      throw new JobError(`${decision.failure.kind}: step ${r.step.name} of run ${entry.runId}`, decision.failure);
    }
    if (decision.action === 'advance') return this.advance(r, begun.output, 'duplicate');
    return this.run(message, r, ctx, decision.timeLeftMs);
  }

  /** The step's row set running (its run's made if absent), counted; the delivery is begun from here on. */
  private async begin(message: StreamMessage, r: Attempt): Promise<BegunStep> {
    const begun = await this.guard(message, r, 'commit', () =>
      this.store.begin({
        runId: r.entry.runId,
        workflow: r.workflow.name,
        tenant: r.entry.tenant,
        steps: r.workflow.steps.map((s) => s.name),
        step: r.step.name,
        redriven: r.entry.redriven,
        delivery: r.delivery,
      }),
    );
    r.unbegun = false;
    this.workflowMetrics.begun(message, r.source, begun);
    return begun;
  }

  /** Runs the step and commits it; the next step's entry (or none) for the ack. */
  private async run(
    message: StreamMessage,
    r: Attempt,
    ctx: JobRunContext,
    timeLeftMs: number,
  ): Promise<DeliveryResult> {
    const startedAt = performance.now();
    const { output, outcome } = await this.runAndCommit(message, r, ctx, timeLeftMs);
    this.logger.debug({ ms: Math.round(performance.now() - startedAt), outcome }, 'step finished');
    // Lost to a delivery that failed the step: that one decided (and dead-lettered); this one only leaves.
    if (outcome === 'undecided') return { outcome: 'duplicate' };
    return this.advance(r, output, outcome === 'won' ? 'done' : 'duplicate');
  }

  /**
   * The FinishedElsewhere check of a batch read together, in one query instead
   * of one per delivery (the commit's guard stays the guard); if it fails, each
   * delivery asks on its own.
   */
  prepare(messages: readonly StreamMessage[], source: EntrySource): void {
    const queue = this.registry.queue(source.queue);
    if (!queue) return;
    const byWorkflow = new Map<WorkflowDefinition, { message: StreamMessage; runId: string }[]>();
    for (const message of messages) {
      const entry = stepEntryRun(message.fields); // its id and workflow only: a malformed one's delivery says so
      const workflow = entry && this.workflowOf(queue, entry);
      if (!entry || !workflow) continue;
      const list = byWorkflow.get(workflow) ?? [];
      list.push({ message, runId: entry.runId });
      byWorkflow.set(workflow, list);
    }
    this.askRunsRecorded(messages);
    for (const [workflow, entries] of byWorkflow) {
      const host = workflow.instance();
      if (!hasFinishedElsewhere(host) || entries.length < 2) continue; // one: its own check is the same query
      const finished = host.finishedAmong(entries.map((e) => e.runId)).catch(() => undefined);
      for (const { message, runId } of entries)
        this.prechecked.set(
          message,
          finished.then((f) => f?.has(runId)),
        );
    }
  }

  /**
   * For the batch's first-step entries that are no re-drive, which runs have a row: one read. A run's first step
   * runs unbegun only when its run has none; a second start's entry of a run already begun or done begins, and so
   * is not run again when its step is done (its model calls not made again).
   */
  private askRunsRecorded(messages: readonly StreamMessage[]): void {
    const firsts = messages.flatMap((message) => {
      const f = message.fields;
      if (f[STEP_ENTRY_FIELDS.step] !== undefined || f[STEP_ENTRY_FIELDS.redriven] !== undefined) return [];
      const run = stepEntryRun(f);
      return run ? [{ message, runId: run.runId.toLowerCase() }] : [];
    });
    if (firsts.length === 0) return;
    const recorded = this.store.runsWithRows(firsts.map((e) => e.runId)).catch(() => undefined);
    for (const { message, runId } of firsts)
      this.runRecorded.set(
        message,
        recorded.then((r) => r?.has(runId)),
      );
  }

  /** The run's record marked failed, in the consumer's dead-letter MULTI (the entry's own partition's record). */
  deadLettered(tx: ChainableCommander, message: StreamMessage, reason: string, source: EntrySource): void {
    const partition = this.registry.queue(source.queue)?.layout.at(source.partition);
    if (!partition) return;
    markRunFailed(tx, partition, message.fields, reason);
  }

  /**
   * The dead letter is written: the run counts failed (WorkflowMetrics). One
   * this handler failed was not done (begin found its step running, or it was
   * refused before any begin). One the consumer decided (max_deliveries) is
   * marked failed in PostgreSQL now, best effort, and counted unless that
   * found the run done (its last step committed, only the ack lost).
   */
  afterDeadLetter(message: StreamMessage, reason: string, source: EntrySource): void {
    if (this.refused.has(message)) return; // refused by the workflow's parser: no run began, none to mark or count
    if (this.failedInStore.has(message)) return this.workflowMetrics.deadLettered(message, source, false);
    let entry: StepEntry;
    try {
      entry = parseStepEntry(message.fields);
    } catch {
      return; // a malformed entry has no run to mark or count
    }
    const queue = this.registry.queue(source.queue);
    const workflow = queue && this.workflowOf(queue, entry);
    if (!workflow) return;
    void this.store
      .fail({
        runId: entry.runId,
        workflow: workflow.name,
        tenant: entry.tenant,
        steps: workflow.steps.map((s) => s.name),
        step: entry.step ?? workflow.steps[0].name,
        error: reason,
      })
      .then(
        (outcome) => this.workflowMetrics.deadLettered(message, source, !outcome.failed),
        (err: unknown) => {
          // Not knowing whether the run was done, it counts failed: an alert once too often, never one missed.
          this.workflowMetrics.deadLettered(message, source);
          this.logger.warn(`could not mark run ${entry.runId} failed: ${String(err)}`);
        },
      );
  }

  logFields(message: StreamMessage): Readonly<Record<string, string | undefined>> {
    // The run id under its wire name, which summaries' log lines have always carried.
    const { job_id: jobId, workflow, step } = message.fields;
    return { job_id: jobId, ...(workflow === undefined ? {} : { workflow }), ...(step === undefined ? {} : { step }) };
  }

  /** The entry's workflow, step and input, or a JobError that dead-letters it (never retried: it cannot get better). */
  private async resolve(message: StreamMessage, source: EntrySource): Promise<Resolved> {
    const queue = this.registry.queue(source.queue);
    const partition = queue?.layout.at(source.partition);
    if (!queue || !partition) throw new JobError(`no workflow reads queue ${source.queue}`, UNKNOWN_WORKFLOW);
    let entry: StepEntry;
    try {
      entry = parseStepEntry(message.fields);
    } catch (err) {
      if (err instanceof MalformedEntryError) throw new JobError(err.message, MALFORMED, { cause: err });
      throw err;
    }
    const workflow = this.workflowOf(queue, entry);
    if (!workflow) {
      const named = entry.workflow === undefined ? 'no workflow named' : `workflow ${entry.workflow}`;
      throw new JobError(`${named}: not one this worker runs on queue ${queue.name}`, UNKNOWN_WORKFLOW);
    }
    if (workflow.parse) entry = this.parsed(message, workflow.parse, entry);
    const index = entry.step === undefined ? 0 : workflow.steps.findIndex((s) => s.name === entry.step);
    const fail = async (failure: ErrorClass, detail: string): Promise<never> => {
      // An unknown step has no row to mark: its run alone is failed (FAIL touches no other step's row).
      const step = workflow.steps[index] ?? { name: entry.step ?? '', method: '' };
      await this.failRun(message, { workflow, entry, step }, failure.kind, detail);
      throw new JobError(detail, failure);
    };
    if (index < 0) return fail(UNKNOWN_STEP, `workflow ${workflow.name} has no step ${entry.step}`);
    let input: unknown = entry.input;
    if (workflow.input) {
      if (!isPlainObject(entry.input)) return fail(INVALID_INPUT, 'invalid input: not a JSON object');
      input = plainToInstance(workflow.input, entry.input);
      const errors = await validate(input as object, { forbidUnknownValues: true });
      if (errors.length > 0) return fail(INVALID_INPUT, `invalid input: ${messagesOf(errors).join('; ')}`);
    }
    return { partition, workflow, step: workflow.steps[index], index, entry, input };
  }

  private workflowOf(queue: WorkflowQueue, entry: Pick<StepEntry, 'workflow'>): WorkflowDefinition | undefined {
    if (entry.workflow !== undefined) return queue.workflows.get(entry.workflow);
    return queue.workflows.size === 1 ? [...queue.workflows.values()][0] : undefined;
  }

  /**
   * The entry with its input as the workflow's parser reads it; what the parser refuses is `malformed`, with its
   * message as the detail, before the pre-check and begin: nothing in PostgreSQL (deadLettered knows: `refused`).
   */
  private parsed(message: StreamMessage, parse: (payload: unknown) => unknown, entry: StepEntry): StepEntry {
    try {
      return { ...entry, input: parse(entry.input) };
    } catch (err) {
      this.refused.add(message);
      throw new JobError(err instanceof Error ? err.message : String(err), MALFORMED, { cause: err });
    }
  }

  /** Runs the step with its context, then commits what it returned and asked for. */
  private async runAndCommit(
    message: StreamMessage,
    r: Attempt,
    ctx: JobRunContext,
    runTimeLeftMs: number,
  ): Promise<{ output: unknown; outcome: CommitOutcome | 'undecided' }> {
    const startedAt = performance.now();
    const limitMs = Math.min(r.step.timeoutMs ?? Infinity, runTimeLeftMs, ctx.deadline - startedAt);
    // One controller, aborted by the step's timer or by the consumer's hard stop: AbortSignal.any() here (a
    // composite following the signal every delivery shares) was among the larger costs of a job in the profile.
    const stop = new AbortController();
    const signal = stop.signal;
    const runDeadlinePassed = () =>
      r.workflow.deadlineMs !== undefined && performance.now() - startedAt >= runTimeLeftMs;
    const step = new StepContextImpl({
      runId: r.entry.runId,
      tenant: r.entry.tenant,
      workflow: r.workflow.name,
      step: r.step.name,
      input: r.input,
      delivery: ctx.delivery,
      state: r.entry.state,
      signal,
      stopRetrying: ctx.stopRetrying,
      deadline: startedAt + limitMs,
      llm: this.llm,
      retry: this.retry,
      metrics: this.metrics,
      logger: this.logger,
      openTransaction: () => this.openTransaction(message, r),
      ...(this.tokens ? { tokens: this.tokens } : {}),
      noteTokenWait: (untilMs) =>
        noteTokenWait(this.redis, r.partition.jobRecordKey(r.entry.runId), r.step.name, untilMs),
    });
    // Set just before the try whose finally clears them.
    const timer = setTimeout(() => stop.abort(new StepTimeoutError(limitMs)), Math.max(0, limitMs));
    const hardStop = () => stop.abort(ctx.signal.reason);
    if (ctx.signal.aborted) hardStop();
    else ctx.signal.addEventListener('abort', hardStop, { once: true });
    try {
      let output: unknown;
      try {
        const host = r.workflow.instance() as Record<string, (c: StepContextImpl<unknown>) => unknown>;
        // The step's own span: its model calls and the outbox rows it asks for (their traceparent) are its children.
        output = await inSpan(
          `step ${r.workflow.name}.${r.step.name}`,
          () => ({
            attributes: {
              'workflow.name': r.workflow.name,
              'workflow.step': r.step.name,
              'workflow.run_id': r.entry.runId,
            },
          }),
          async () => host[r.step.method](step),
        );
      } catch (err) {
        // Its writes go first, and its lock on the step row with them: marking the step failed needs that row.
        await this.rollback(step);
        await this.failed(message, r, err, 'step', signal.aborted, runDeadlinePassed());
      }
      // Only its writes are left: its slot can take the next entry while it commits. Not a step in a transaction of
      // its own: that one holds a pooled connection and its locks until its commit, and the pool is sized for one
      // such step per slot.
      if (!step.openedTransaction()) ctx.workDone?.();
      const writes = step.writes();
      const commit: StepCommit = {
        runId: r.entry.runId,
        step: r.step.name,
        output: output ?? null,
        ...(r.index === r.workflow.steps.length - 1 ? { runOutput: this.runOutput(r, output) } : {}),
        inserts: writes.inserts,
        outbox: writes.outbox,
        ...(r.unbegun
          ? {
              unbegun: {
                workflow: r.workflow.name,
                tenant: r.entry.tenant,
                steps: r.workflow.steps.map((s) => s.name),
              },
            }
          : {}),
      };
      const opened = step.openedTransaction();
      const committed = await this.guard(message, r, 'commit', async () =>
        opened ? (await opened).commit(commit) : this.store.commit(commit),
      );
      if (r.unbegun) {
        // Unbegun until now: counted as begun once, with whether its commit started the run.
        r.unbegun = false;
        this.workflowMetrics.begun(message, r.source, {
          runCreated: committed.runCreated,
          attempts: committed.outcome === 'won' ? committed.attempts : 1,
        });
      }
      if (committed.outcome === 'won') return { output, outcome: 'won' };
      const recorded = await this.guard(message, r, 'commit', () =>
        this.store.recordedOutput(r.entry.runId, r.step.name),
      );
      if (recorded.status === 'done') return { output: recorded.output, outcome: 'lost' };
      if (recorded.status === 'failed') return { output: undefined, outcome: 'undecided' };
      // Another delivery holds the step (it began it while this one ran unbegun), or its run failed before any
      // step row: a counted retry, so the next delivery is no first one and begins (running, done or failed decide).
      throw new JobError(`${RUNNING_ELSEWHERE.kind}: step ${r.step.name} of run ${r.entry.runId}`, RUNNING_ELSEWHERE);
    } finally {
      clearTimeout(timer);
      ctx.signal.removeEventListener('abort', hardStop);
      await this.rollback(step);
    }
  }

  /**
   * The step's own transaction. A step running unbegun is begun first: the
   * transaction locks its run's and step's rows, which must exist for that;
   * a begin that finds the step anything but `running` (another delivery
   * holds, committed or failed it) hands this delivery back.
   */
  private async openTransaction(message: StreamMessage, r: Attempt): Promise<StepTransaction> {
    if (r.unbegun) {
      const begun = await this.begin(message, r);
      // Counted (not handed back): the next delivery is no first one, and begins before it runs.
      if (begun.status !== 'running')
        throw new JobError(
          `${RUNNING_ELSEWHERE.kind}: step ${r.step.name} of run ${r.entry.runId} is ${begun.status} elsewhere`,
          RUNNING_ELSEWHERE,
        );
    }
    return this.store.openTransaction(r.entry.runId, r.step.name);
  }

  /** Rolls back the step's own transaction, if it opened one and it is still open (idempotent). */
  private async rollback(step: StepContextImpl<unknown>): Promise<void> {
    const opened = step.openedTransaction();
    if (opened) await opened.then((t) => t.rollback()).catch(() => undefined);
  }

  /** The run's output: the steps' outputs merged in order (plain objects, shallow), this last one included. */
  private runOutput(r: Resolved, output: unknown): Record<string, unknown> {
    const merged: Record<string, unknown> = {};
    for (const s of r.workflow.steps.slice(0, r.index)) {
      const earlier = r.entry.state[s.name];
      if (isPlainObject(earlier)) Object.assign(merged, earlier);
    }
    if (isPlainObject(output)) Object.assign(merged, output);
    return merged;
  }

  /** The next step's entry, added by the ack once per (run, step) (none after the last step). */
  private advance(r: Resolved, output: unknown, outcome: string): DeliveryResult {
    const next = r.workflow.steps[r.index + 1];
    if (!next) return { outcome };
    // The next step continues this delivery's trace (undefined, and no field, when tracing is off).
    const traceparent = activeTraceparent();
    const fields = stepEntryFields({
      ...nextStepEntry(r.entry, next.name, r.step.name, output ?? undefined),
      ...(traceparent === undefined ? {} : { traceparent }),
    });
    // Once per (run, step), on the run's record: whichever delivery of this step acks, the next is added once.
    const gate = {
      key: r.partition.jobRecordKey(r.entry.runId),
      field: `next:${r.step.name}`,
      ttlMs: JOB_RECORD_TTL_MS,
    };
    return { outcome, next: { stream: r.partition.jobs, fields, gate } };
  }

  /** Runs a store call; its error becomes the JobError decideFailure says. */
  private async guard<T>(message: StreamMessage, r: Failing, phase: FailurePhase, op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      return this.failed(message, r, err, phase, false, false);
    }
  }

  /** Classifies a failure; one that cannot get better fails the run in PostgreSQL first. Always throws. */
  private async failed(
    message: StreamMessage,
    r: Failing,
    err: unknown,
    phase: FailurePhase,
    aborted: boolean,
    deadlinePassed: boolean,
  ): Promise<never> {
    // Already decided (a failure of this delivery classified further in): as it is.
    if (err instanceof JobError && !(err instanceof RetryError)) throw err;
    const failure = decideFailure(err, { phase, aborted, deadlinePassed });
    // The run's row has no reason column: its error always names the kind; the dead letter has `reason` beside it.
    const detail = `${failure.kind}: ${err instanceof Error ? err.message : String(err)}`;
    if (!failure.retryable) await this.failRun(message, r, failure.kind, detail);
    throw new JobError(failureDetail(err, failure), failure, { cause: err });
  }

  /** Marks the step and run failed in PostgreSQL: best effort (the dead letter and the run record still say it). */
  private async failRun(message: StreamMessage, r: Failing, reason: string, detail = reason): Promise<void> {
    this.failedInStore.add(message);
    const unbegun = r.unbegun === true;
    try {
      const { runCreated } = await this.store.fail({
        runId: r.entry.runId,
        workflow: r.workflow.name,
        tenant: r.entry.tenant,
        steps: r.workflow.steps.map((s) => s.name),
        step: r.step.name,
        error: detail.slice(0, 1000),
        ...(unbegun ? { unbegunAttempts: r.delivery ?? 1 } : {}),
      });
      // A step that ran unbegun and failed for good: its run started (and fails) with this delivery.
      if (unbegun && r.source) this.workflowMetrics.begun(message, r.source, { runCreated, attempts: r.delivery ?? 1 });
    } catch (err) {
      this.logger.warn(`could not mark run ${r.entry.runId} failed (${reason}): ${String(err)}`);
    }
  }
}
