import {
  decideDelivery,
  decideFailure,
  type DeliveryFacts,
  type FailureFacts,
  failureDetail,
  runsUnbegun,
  type UnbegunFacts,
} from './decide';
import {
  DeadlineExceededError,
  NonRetryableError,
  RetriesExhaustedError,
  RetryCancelledError,
} from './retry/retry.errors';
import { NonRetryableStepError } from './workflow.errors';

describe('decideDelivery', () => {
  const facts = (f: Partial<DeliveryFacts>): DeliveryFacts => ({
    step: 'running',
    delivery: 1,
    maxDeliveries: 5,
    runAgeMs: 0,
    ...f,
  });
  it.each<[string, Partial<DeliveryFacts>, ReturnType<typeof decideDelivery>]>([
    ['a first delivery, no deadline', {}, { action: 'run', timeLeftMs: Infinity }],
    ['a first delivery within the deadline', { runAgeMs: 200, deadlineMs: 1000 }, { action: 'run', timeLeftMs: 800 }],
    ['the last delivery allowed', { delivery: 5 }, { action: 'run', timeLeftMs: Infinity }],
    [
      'one delivery too many',
      { delivery: 6 },
      { action: 'fail', failure: { kind: 'max_deliveries', retryable: false } },
    ],
    [
      'the deadline reached',
      { runAgeMs: 1000, deadlineMs: 1000 },
      { action: 'fail', failure: { kind: 'deadline', retryable: false } },
    ],
    [
      'the deadline passed',
      { runAgeMs: 5000, deadlineMs: 1000 },
      { action: 'fail', failure: { kind: 'deadline', retryable: false } },
    ],
    ['a committed step', { step: 'done' }, { action: 'advance' }],
    [
      'a run another delivery holds (its own transaction, a commit)',
      { step: 'busy' },
      { action: 'retry', failure: { kind: 'running_elsewhere', retryable: true } },
    ],
    [
      'a run another delivery holds, past max deliveries: still its call',
      { step: 'busy', delivery: 9 },
      { action: 'retry', failure: { kind: 'running_elsewhere', retryable: true } },
    ],
    ['a committed step, redelivered past max deliveries', { step: 'done', delivery: 9 }, { action: 'advance' }],
    ['a run another delivery failed (no re-drive)', { step: 'failed' }, { action: 'drop' }],
    ['a run another delivery failed, past max deliveries', { step: 'failed', delivery: 9 }, { action: 'drop' }],
    [
      'a committed step, the deadline passed',
      { step: 'done', runAgeMs: 5000, deadlineMs: 1000 },
      { action: 'advance' },
    ],
  ])('%s', (_, f, expected) => {
    expect(decideDelivery(facts(f))).toEqual(expected);
  });
});

describe('runsUnbegun', () => {
  const first: UnbegunFacts = { delivery: 1, redriven: false, stepIndex: 0 };
  it.each<[string, Partial<UnbegunFacts>, boolean]>([
    ["a run's first step, first delivery, no deadline", {}, true],
    ['its redelivery (an earlier one may have begun, failed or committed it)', { delivery: 2 }, false],
    ['a re-driven entry (its run has rows, failed)', { redriven: true }, false],
    ['a later step (its run has a row: done, failed or busy are read first)', { stepIndex: 1 }, false],
    ['a workflow with a deadline (counted from the begin)', { deadlineMs: 60_000 }, false],
  ])('%s: %s', (_, facts, expected) => {
    expect(runsUnbegun({ ...first, ...facts })).toBe(expected);
  });
});

describe('decideFailure', () => {
  const facts = (f: Partial<FailureFacts> = {}): FailureFacts => ({
    phase: 'step',
    deadlinePassed: false,
    aborted: false,
    ...f,
  });
  const pgError = (code: string) => Object.assign(new Error(`pg ${code}`), { code });
  const server = { kind: 'server', retryable: true, status: 503 };
  const client = { kind: 'client', retryable: false, status: 400 };
  it.each<[string, unknown, Partial<FailureFacts>, { kind: string; retryable: boolean }]>([
    [
      'a model 400 (NonRetryable)',
      new NonRetryableError('400', 1, client),
      {},
      { kind: 'llm_client', retryable: false },
    ],
    [
      '503s until the attempts ran out',
      new RetriesExhaustedError('503', 4, server),
      {},
      { kind: 'llm_server', retryable: true },
    ],
    [
      'the delivery budget left no room',
      new DeadlineExceededError('budget', 2, server),
      {},
      { kind: 'llm_server', retryable: true },
    ],
    [
      'a model call cut off by a drain',
      new RetryCancelledError('cancelled', 1, undefined),
      { aborted: true },
      { kind: 'llm_cancelled', retryable: true },
    ],
    [
      'a transient model failure past the run deadline',
      new RetriesExhaustedError('503', 4, server),
      { deadlinePassed: true },
      { kind: 'deadline', retryable: false },
    ],
    ['the step says no', new NonRetryableStepError('no'), {}, { kind: 'step_failed', retryable: false }],
    [
      'the step says no, with its reason',
      new NonRetryableStepError('no', 'ticket_closed'),
      { deadlinePassed: true },
      { kind: 'ticket_closed', retryable: false },
    ],
    ['PostgreSQL away (08006) in the step', pgError('08006'), {}, { kind: 'database', retryable: true }],
    [
      'PostgreSQL away (ECONNREFUSED) at the commit',
      pgError('ECONNREFUSED'),
      { phase: 'commit' },
      { kind: 'database', retryable: true },
    ],
    ['a schema not migrated yet (42P01)', pgError('42P01'), { phase: 'commit' }, { kind: 'database', retryable: true }],
    ['a bad row at the commit (23502)', pgError('23502'), { phase: 'commit' }, { kind: 'database', retryable: false }],
    ['a bug in the step', new TypeError('x is undefined'), {}, { kind: 'unexpected', retryable: false }],
    [
      "a step's own file not found (ENOENT) is no database error",
      Object.assign(new Error("ENOENT: no such file or directory, open 'x'"), { code: 'ENOENT', syscall: 'open' }),
      {},
      { kind: 'unexpected', retryable: false },
    ],
    [
      'a step\'s own message saying "connect" is no database error',
      new Error('could not connect the dots'),
      {},
      { kind: 'unexpected', retryable: false },
    ],
    [
      "another service's ECONNREFUSED in the step is no database error",
      Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED', syscall: 'connect' }),
      {},
      { kind: 'unexpected', retryable: false },
    ],
    [
      "the driver's lost connection in the step",
      Object.assign(new Error('Query failed'), {
        name: 'QueryFailedError',
        driverError: new Error('Connection terminated unexpectedly'),
      }),
      {},
      { kind: 'database', retryable: true },
    ],
    [
      'a commit whose outcome is unknown (the connection lost at COMMIT)',
      new Error('Connection terminated unexpectedly'),
      { phase: 'commit' },
      { kind: 'database', retryable: true },
    ],
    [
      'a commit that failed for a reason of the engine (no row back)',
      new Error('begin returned no row'),
      { phase: 'commit' },
      { kind: 'database', retryable: true },
    ],
    [
      'a syntax error at the commit (42601)',
      pgError('42601'),
      { phase: 'commit' },
      { kind: 'database', retryable: false },
    ],
    [
      'a bad value at the commit (22P02)',
      pgError('22P02'),
      { phase: 'commit' },
      { kind: 'database', retryable: false },
    ],
    [
      "an insert's own fault at the commit (insert_failed)",
      new NonRetryableStepError('relation "nope" does not exist', 'insert_failed'),
      { phase: 'commit' },
      { kind: 'insert_failed', retryable: false },
    ],
    [
      'an output that cannot be serialized',
      new NonRetryableStepError('BigInt', 'output_not_serializable'),
      { phase: 'commit' },
      { kind: 'output_not_serializable', retryable: false },
    ],
    [
      'a step cut off by its timeout',
      new DOMException('aborted', 'AbortError'),
      { aborted: true },
      { kind: 'step_timeout', retryable: true },
    ],
    [
      'a step cut off past the run deadline',
      new DOMException('aborted', 'AbortError'),
      { aborted: true, deadlinePassed: true },
      { kind: 'deadline', retryable: false },
    ],
  ])('%s', (_, err, f, expected) => {
    expect(decideFailure(err, facts(f))).toEqual(expected);
  });
});

describe('failureDetail', () => {
  const client = { kind: 'client', retryable: false, status: 400 } as const;
  const facts = (f: Partial<FailureFacts>): FailureFacts => ({
    phase: 'step',
    deadlinePassed: false,
    aborted: false,
    ...f,
  });
  it.each<[string, unknown, Partial<FailureFacts>, string]>([
    [
      'a model call that failed for good: its own message (the reason is its class already)',
      new NonRetryableError('model call failed: 400 bad request', 1, client),
      {},
      'model call failed: 400 bad request',
    ],
    [
      "a step's own verdict: its message",
      new NonRetryableStepError('the ticket is closed', 'ticket_closed'),
      { deadlinePassed: true },
      'the ticket is closed',
    ],
    [
      'a model call cut off by the run deadline: the engine says deadline first',
      new RetriesExhaustedError('model call failed 4 times: 503', 4, { kind: 'server', retryable: true }),
      { deadlinePassed: true },
      'deadline: model call failed 4 times: 503',
    ],
    ['a bug in the step: unexpected first', new TypeError('x is undefined'), {}, 'unexpected: x is undefined'],
    ['something thrown that is not an Error', 'boom', {}, 'unexpected: boom'],
  ])('%s', (_, err, f, detail) => {
    expect(failureDetail(err, decideFailure(err, facts(f)))).toBe(detail);
  });
});
