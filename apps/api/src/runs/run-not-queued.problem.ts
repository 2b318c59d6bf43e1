import { type ProblemException, serviceUnavailable } from '@app/problem';
import { RunNotQueuedError } from '@app/workflows';

/**
 * What a route that starts a workflow answers when the queue did not take
 * the run (RunNotQueuedError): 503 with Retry-After, which frees the
 * idempotency key so the retry with it starts the same run, once. `noun` is
 * what the route calls a run (summaries: `job`). Anything else a start throws
 * is a bug and goes on as it is (500): it was not a queue that was down.
 *
 * Use: `await handle.start(input, options).catch(rethrowNotQueued('run'))`.
 */
export function rethrowNotQueued(noun: 'job' | 'run'): (err: unknown) => never {
  return (err) => {
    throw err instanceof RunNotQueuedError ? notQueuedProblem(err, noun) : err;
  };
}

export function notQueuedProblem(err: RunNotQueuedError, noun: 'job' | 'run'): ProblemException {
  const queue = noun === 'job' ? 'job queue' : 'workflow queue';
  // Written on a master that no replica confirmed in time: not acknowledged, since losing that master would lose
  // it. A retry names the same run, which runs once.
  if (err.reason === 'not_replicated')
    return serviceUnavailable(
      `The ${noun} could not be queued durably`,
      `No replica of the ${queue} confirmed the ${noun} in time. Retry with the same Idempotency-Key; the ${noun} ` +
        `${noun === 'job' ? 'runs' : 'happens'} once however often it was queued.`,
    );
  return serviceUnavailable(
    `The ${noun} could not be queued`,
    `The ${queue} is unreachable; nothing was queued. Retry with the same Idempotency-Key.`,
  );
}
