import { retryDelayMs } from './backoff';

describe('retryDelayMs (equal jitter, capped exponential)', () => {
  it('doubles from the base per failure, between half and all of the step', () => {
    expect([1, 2, 3, 4].map((n) => retryDelayMs(n, 1000, 300_000, () => 0))).toEqual([500, 1000, 2000, 4000]);
    expect([1, 2, 3, 4].map((n) => retryDelayMs(n, 1000, 300_000, () => 1))).toEqual([1000, 2000, 4000, 8000]);
  });

  it('never exceeds the cap, however many failures', () => {
    expect(retryDelayMs(30, 1000, 300_000, () => 1)).toBe(300_000);
    expect(retryDelayMs(1000, 1000, 300_000, () => 0)).toBe(150_000);
  });

  it('treats a nonsensical count as the first failure', () => {
    expect(retryDelayMs(0, 1000, 300_000, () => 1)).toBe(1000);
  });
});
