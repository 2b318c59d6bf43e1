/**
 * Thrown by a step that knows retrying cannot help (the input makes no sense
 * to it, a business rule says no): the run fails at once and the step is
 * dead-lettered with `reason` (default `step_failed`), whatever the delivery count.
 */
export class NonRetryableStepError extends Error {
  constructor(
    message: string,
    readonly reason = 'step_failed',
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}
