import { backoffDelay } from './backoff';

describe('backoffDelay', () => {
  const backoff = { baseMs: 100, capMs: 5000 };

  it('without a random source is the capped exponential step itself', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((retry) => backoffDelay(retry, backoff))).toEqual([
      100, 200, 400, 800, 1600, 3200, 5000, 5000,
    ]);
  });

  it('with one draws full jitter: anywhere in [0, step)', () => {
    expect(backoffDelay(3, backoff, () => 0)).toBe(0);
    expect(backoffDelay(3, backoff, () => 0.5)).toBe(400);
    expect(backoffDelay(3, backoff, () => 0.999999)).toBe(799);
    expect(backoffDelay(10, backoff, () => 0.999999)).toBe(4999);
  });

  it('stays at the cap however long it has been failing', () => {
    expect(backoffDelay(5000, backoff)).toBe(5000);
    expect(backoffDelay(-1, backoff)).toBe(100);
  });
});
