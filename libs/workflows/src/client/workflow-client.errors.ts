/** `start` named a workflow this app did not register (WorkflowClientModule.forClient): a bug in the caller. */
export class UnregisteredWorkflowError extends Error {
  constructor(readonly workflow: string) {
    super(`no workflow "${workflow}" is registered with this client`);
    this.name = new.target.name;
  }
}

/**
 * The queue did not take the run: Redis was unreachable or refused for now
 * (`unreachable`: nothing was queued), or the master took it and no replica
 * confirmed it in time (`not_replicated`: it may be queued, but losing that
 * master would lose it). Either way the start was not acknowledged, and a
 * retry of the same request starts the same run, once. The one error of a
 * start that means "try again"; anything else a start throws is a bug.
 */
export class RunNotQueuedError extends Error {
  constructor(
    readonly reason: 'unreachable' | 'not_replicated',
    cause: unknown,
  ) {
    super(
      reason === 'not_replicated' ? 'no replica confirmed the run in time' : 'the workflow queue did not take the run',
      { cause },
    );
    this.name = new.target.name;
  }
}

/**
 * A start whose run would belong to another tenant: its idempotency operation
 * is not scoped to the tenant starting it (`operation`), or the run's record
 * already names another tenant (`record`), which the start refuses rather
 * than hand that tenant's run over. Nothing was written. A bug (or a forged
 * context), never a retryable condition.
 */
export class RunTenantMismatchError extends Error {
  constructor(
    readonly tenant: string,
    readonly found: 'operation' | 'record',
  ) {
    super(
      found === 'operation'
        ? `the idempotency operation is not scoped to tenant "${tenant}"`
        : `the run's record belongs to another tenant than "${tenant}"`,
    );
    this.name = new.target.name;
  }
}

/**
 * A run's state cannot be told right now: PostgreSQL did not answer, or the
 * run has no row there and Redis, which would say whether it is queued, did
 * not answer either. Not "not found": the run may well exist.
 */
export class RunStateUnavailableError extends Error {
  constructor(cause?: unknown) {
    super('the run state stores did not answer', cause === undefined ? undefined : { cause });
    this.name = new.target.name;
  }
}
