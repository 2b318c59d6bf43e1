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
  // What the client (ApiClient) and the model calls (classifyLlmError, @app/llm) both read.
  it.each<[Record<string, string>, number | undefined]>([
    [{}, undefined],
    [{ 'retry-after': '1' }, 1000],
    [{ 'retry-after': '2' }, 2000],
    [{ 'retry-after': '0' }, 0],
    [{ 'retry-after': ' 3 ' }, 3000],
    [{ 'retry-after-ms': '250' }, 250],
    [{ 'retry-after-ms': '250', 'retry-after': '9' }, 250],
    [{ 'retry-after-ms': '1500', 'retry-after': '9' }, 1500],
    // Fractions of a millisecond round up: never sooner than asked.
    [{ 'retry-after-ms': '0.4' }, 1],
    [{ 'retry-after-ms': '12.5' }, 13],
    // An unreadable retry-after-ms leaves Retry-After to say.
    [{ 'retry-after-ms': 'soon', 'retry-after': '2' }, 2000],
    [{ 'retry-after': 'soon' }, undefined],
    // delay-seconds is 1*DIGIT (RFC 9110 §10.2.3): no fraction, no sign, and
    // not read as a date either (Date.parse('0.5') is in the year 2000).
    [{ 'retry-after': '0.5' }, undefined],
    [{ 'retry-after': '-1' }, undefined],
    [{ 'retry-after': '1e3' }, undefined],
    // IMF-fixdate; in the past it is 0.
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:28:05 GMT' }, 5000],
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:27:00 GMT' }, 0],
    // The two obsolete HTTP-date formats a recipient must accept (RFC 9110 §5.6.7).
    [{ 'retry-after': 'Wednesday, 21-Oct-15 07:28:05 GMT' }, 5000],
    [{ 'retry-after': 'Wed Oct 21 07:28:05 2015' }, 5000],
    [{ 'retry-after': 'Wed Oct  1 07:28:05 2015' }, 0],
    // Dates that are not HTTP-dates are ignored, however Date.parse would read them.
    [{ 'retry-after': '2015-10-21T07:28:05Z' }, undefined],
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:28:05 +0000' }, undefined],
    [{ 'retry-after': 'Wed, 21 Oct 2015 25:28:05 GMT' }, undefined],
    [{ 'retry-after': 'Wed, 21 Foo 2015 07:28:05 GMT' }, undefined],
  ])('%j → %s', (headers, expected) => {
    expect(parseRetryAfter(new Headers(headers), Date.parse('Wed, 21 Oct 2015 07:28:00 GMT'))).toBe(expected);
  });

  it('reads seconds, milliseconds and HTTP dates', () => {
    // The cases of the classifier's own parser (retryAfterFrom) before the two were one.
    const now = Date.parse('2026-11-30T12:00:00Z');
    expect(parseRetryAfter(new Headers({ 'retry-after': '2' }), now)).toBe(2000);
    // It read 500: fractional delay-seconds are not RFC 9110's, and are ignored now.
    expect(parseRetryAfter(new Headers({ 'retry-after': '0.5' }), now)).toBeUndefined();
    expect(parseRetryAfter(new Headers({ 'retry-after-ms': '250' }), now)).toBe(250);
    expect(parseRetryAfter(new Headers({ 'retry-after': 'Mon, 30 Nov 2026 12:00:04 GMT' }), now)).toBe(4000);
    expect(parseRetryAfter(new Headers({ 'retry-after': 'soon' }), now)).toBeUndefined();
    expect(parseRetryAfter(new Headers({}), now)).toBeUndefined();
  });

  it('takes a two-digit rfc850 year as the latest one at most 50 years ahead', () => {
    const now = Date.parse('2026-11-30T12:00:00Z');
    const at = (value: string) => parseRetryAfter(new Headers({ 'retry-after': value }), now);
    expect(at('Monday, 30-Nov-26 12:00:04 GMT')).toBe(4000);
    // 2076 is 50 years ahead: still ahead. 2077 would be 51: it is 1977, long past.
    expect(at('Monday, 30-Nov-76 12:00:00 GMT')).toBe(Date.UTC(2076, 10, 30, 12) - now);
    expect(at('Tuesday, 30-Nov-77 12:00:00 GMT')).toBe(0);
  });
});
