import { HandlerDurations, retryAfterSeconds } from './retry-after';

describe('retryAfterSeconds', () => {
  it.each([
    // running for, expires in, typical run → Retry-After
    ['nothing known about the route', 5, 9_995, undefined, 1],
    ['a fast route', 5, 9_995, 12, 1],
    ['a slow route, just started', 100, 9_900, 4_000, 4],
    ['a slow route, half done', 2_100, 7_900, 4_000, 2],
    ['running longer than usual', 6_000, 4_000, 4_000, 1],
    ['a route slower than the lock (it renews): never past the expiry', 100, 9_900, 60_000, 9],
    ['a lock about to expire', 9_700, 300, 60_000, 1],
  ])('%s: %d ms run, lock for %d ms, typical %s ms → %d s', (_, runningForMs, expiresInMs, typicalMs, expected) => {
    expect(retryAfterSeconds({ runningForMs, expiresInMs }, typicalMs)).toBe(expected);
  });
});

describe('HandlerDurations', () => {
  const route = (): void => undefined;

  it('knows nothing before the first run', () => {
    expect(new HandlerDurations().typical(route)).toBeUndefined();
  });

  it('gives the 90th percentile of the last 64 runs, per route', () => {
    const durations = new HandlerDurations();
    const other = (): void => undefined;
    for (let i = 1; i <= 100; i++) durations.record(route, i);
    durations.record(other, 7);
    // The last 64 runs are 37..100; their 90th percentile is the 58th of them.
    expect(durations.typical(route)).toBe(94);
    expect(durations.typical(other)).toBe(7);
  });
});
