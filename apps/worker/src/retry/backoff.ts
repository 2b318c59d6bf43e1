/** A capped exponential: the first retry's step, and the longest step. */
export interface Backoff {
  readonly baseMs: number;
  readonly capMs: number;
}

/**
 * The wait before retry `retry` (0 for the first): the step
 * min(cap, base × 2^retry), or with a random source (uniform in [0, 1)) full
 * jitter over it, a wait anywhere in [0, step).
 */
export function backoffDelay(retry: number, { baseMs, capMs }: Backoff, random?: () => number): number {
  const step = Math.min(capMs, baseMs * 2 ** Math.max(0, retry));
  return random ? Math.floor(random() * step) : step;
}
