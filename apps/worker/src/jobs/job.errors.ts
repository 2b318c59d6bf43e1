/**
 * What a job's outcome means for its message. The consumer acts on these
 * types only: a transient failure leaves the message pending for
 * redelivery, a permanent one dead-letters it at once.
 */
export abstract class JobError extends Error {
  constructor(
    message: string,
    /** Short and stable: a metric label and the dead letter's reason. */
    readonly reason: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}

export class TransientJobError extends JobError {}

export class PermanentJobError extends JobError {}
