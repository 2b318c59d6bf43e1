import {
  type AttemptEnd,
  classifyStatus,
  decideAfterAttempt,
  fullJitterDelay,
  parseRetryAfter,
  type RetryFacts,
} from './retry-decision';

const backoff = { baseMs: 100, capMs: 5_000 };
const facts = (end: AttemptEnd, over: Partial<RetryFacts> = {}): RetryFacts => ({
  end,
  attempts: 1,
  maxAttempts: 8,
  remainingMs: 20_000,
  minAttemptMs: 50,
  backoff,
  random: () => 0.5,
  ...over,
});
const status = (s: number, retryAfterMs?: number): AttemptEnd => ({ kind: 'response', status: s, retryAfterMs });

describe('classifyStatus', () => {
  it.each([
    [200, 'success'],
    [201, 'success'],
    [202, 'success'],
    [204, 'success'],
    [408, 'retryable'],
    [409, 'retryable'],
    [425, 'retryable'],
    [429, 'retryable'],
    [500, 'retryable'],
    [502, 'retryable'],
    [503, 'retryable'],
    [504, 'retryable'],
    [301, 'rejected'],
    [400, 'rejected'],
    [401, 'rejected'],
    [403, 'rejected'],
    [404, 'rejected'],
    [405, 'rejected'],
    [410, 'rejected'],
    [413, 'rejected'],
    [415, 'rejected'],
    [422, 'rejected'],
    [451, 'rejected'],
  ] as const)('%i is %s', (s, expected) => {
    expect(classifyStatus(s)).toBe(expected);
  });
});

describe('decideAfterAttempt', () => {
  it.each<[string, RetryFacts, ReturnType<typeof decideAfterAttempt>]>([
    ['2xx: done', facts(status(202)), { action: 'succeed' }],
    ['422: rejected, never retried', facts(status(422)), { action: 'reject' }],
    ['400 even on the last attempt: rejected', facts(status(400), { attempts: 8 }), { action: 'reject' }],
    [
      '401 with no time left: still rejected (a definitive answer)',
      facts(status(401), { remainingMs: 0 }),
      { action: 'reject' },
    ],
    ['503: retried after full jitter', facts(status(503)), { action: 'retry', delayMs: 50 }],
    ['a connection error: retried', facts({ kind: 'network' }, { attempts: 3 }), { action: 'retry', delayMs: 200 }],
    ['a timeout: retried', facts({ kind: 'timeout' }), { action: 'retry', delayMs: 50 }],
    [
      "409 with Retry-After: the server's wait, not the jitter",
      facts(status(409, 1000)),
      { action: 'retry', delayMs: 1000 },
    ],
    ['429 with Retry-After: 0: at once', facts(status(429, 0)), { action: 'retry', delayMs: 0 }],
    [
      'Retry-After past the deadline: waits only until one last attempt fits',
      facts(status(409, 5000), { remainingMs: 1200 }),
      { action: 'retry', delayMs: 1150 },
    ],
    [
      'jitter past the deadline: capped the same way',
      facts({ kind: 'timeout' }, { attempts: 8, maxAttempts: 20, remainingMs: 300, random: () => 0.99 }),
      { action: 'retry', delayMs: 250 },
    ],
    [
      'no time left for an attempt: unknown (deadline)',
      facts({ kind: 'timeout' }, { remainingMs: 40 }),
      { action: 'give-up', reason: 'deadline' },
    ],
    [
      'a 5xx and no time left: unknown (deadline)',
      facts(status(500), { remainingMs: 10 }),
      { action: 'give-up', reason: 'deadline' },
    ],
    [
      'attempts used up: unknown (attempts)',
      facts(status(503), { attempts: 8 }),
      { action: 'give-up', reason: 'attempts' },
    ],
  ])('%s', (_name, input, expected) => {
    expect(decideAfterAttempt(input)).toEqual(expected);
  });
});

describe('fullJitterDelay', () => {
  it('is uniform in [0, min(cap, base·2^retry)): the injected random picks the point', () => {
    expect(fullJitterDelay(0, backoff, () => 0)).toBe(0);
    expect(fullJitterDelay(0, backoff, () => 0.5)).toBe(50);
    expect(fullJitterDelay(3, backoff, () => 0.5)).toBe(400);
    expect(fullJitterDelay(3, backoff, () => 0.999999)).toBe(799);
    expect(fullJitterDelay(10, backoff, () => 0.999999)).toBe(4999); // capped
    expect(fullJitterDelay(1000, backoff, () => 0.5)).toBe(2500); // no overflow past the cap
  });

  it('stays inside its bounds for every retry and many random draws', () => {
    let seed = 3;
    const rand = () => ((seed = (seed * 16807) % 2147483647) - 1) / 2147483646;
    for (let retry = 0; retry < 20; retry++) {
      const ceiling = Math.min(backoff.capMs, backoff.baseMs * 2 ** retry);
      for (let i = 0; i < 200; i++) {
        const d = fullJitterDelay(retry, backoff, rand);
        expect(d).toBeGreaterThanOrEqual(0);
        expect(d).toBeLessThan(ceiling);
      }
    }
  });

  it('treats a random source outside [0, 1) as 0 rather than waiting past the ceiling', () => {
    expect(fullJitterDelay(2, backoff, () => 1)).toBe(0);
    expect(fullJitterDelay(2, backoff, () => Number.NaN)).toBe(0);
  });
});

describe('parseRetryAfter', () => {
  it.each<[Record<string, string>, number | undefined]>([
    [{}, undefined],
    [{ 'retry-after': '1' }, 1000],
    [{ 'retry-after': ' 3 ' }, 3000],
    [{ 'retry-after-ms': '250' }, 250],
    [{ 'retry-after-ms': '250', 'retry-after': '9' }, 250],
    [{ 'retry-after': 'soon' }, undefined],
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:28:05 GMT' }, 5000],
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:27:00 GMT' }, 0],
  ])('%j → %s', (headers, expected) => {
    expect(parseRetryAfter(new Headers(headers), Date.parse('Wed, 21 Oct 2015 07:28:00 GMT'))).toBe(expected);
  });
});
