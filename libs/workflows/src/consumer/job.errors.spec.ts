import {
  DeadlineExceededError,
  NonRetryableError,
  RetriesExhaustedError,
  RetryCancelledError,
} from '../retry/retry.errors';
import { failureOf, JobError, UNEXPECTED } from './job.errors';

describe("the worker's one error model", () => {
  it('a JobError is its class; anything else is unexpected, never retried', () => {
    expect(failureOf(new JobError('x', { kind: 'database', retryable: true }))).toEqual({
      kind: 'database',
      retryable: true,
    });
    expect(failureOf(new Error('bug'))).toBe(UNEXPECTED);
    expect(failureOf('a string')).toEqual({ kind: 'unexpected', retryable: false });
  });

  it.each([
    [
      'NonRetryable',
      new NonRetryableError('m', 1, { kind: 'client', retryable: false, status: 400 }),
      { kind: 'llm_client', retryable: false },
    ],
    [
      'RetriesExhausted',
      new RetriesExhaustedError('m', 4, { kind: 'server', retryable: true }),
      { kind: 'llm_server', retryable: true },
    ],
    [
      'DeadlineExceeded',
      new DeadlineExceededError('m', 1, { kind: 'rate_limited', retryable: true }),
      { kind: 'llm_rate_limited', retryable: true },
    ],
    [
      'DeadlineExceeded before any call',
      new DeadlineExceededError('m', 0, undefined),
      { kind: 'llm_cancelled', retryable: true },
    ],
    ['RetryCancelled', new RetryCancelledError('m', 0, undefined), { kind: 'llm_cancelled', retryable: true }],
  ])("%s: a RetryError takes the last call's class as the job's", (_name, err, failure) => {
    expect(failureOf(err)).toEqual(failure);
    expect(err.transient).toBe(failure.retryable);
  });
});
