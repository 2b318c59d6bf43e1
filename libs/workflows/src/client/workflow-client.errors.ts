/** `start` named a workflow this app did not register (WorkflowClientModule.forClient): a bug in the caller. */
export class UnregisteredWorkflowError extends Error {
  constructor(readonly workflow: string) {
    super(`no workflow "${workflow}" is registered with this client`);
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
