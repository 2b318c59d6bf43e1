/**
 * How much of the step is drawn at random (AWS Architecture Blog,
 * "Exponential Backoff And Jitter"):
 *
 * - `none`: the step itself, for a single client where nothing else retries
 *   in step with it (the consumer's loop, the Redis reconnect).
 * - `full`: anywhere in [0, step), the most spread-out, for many callers
 *   failing together (the worker's retries of a provider call).
 * - `equal`: half the step fixed, half random, in [step/2, step], so a retry
 *   never comes back at once to a dependency that is down (full jitter can
 *   draw ~0) while the retries of one failed batch still spread out (the
 *   relay's rows and its LISTEN reconnect).
 */
export type Jitter = 'none' | 'full' | 'equal';

/** A capped exponential: the first retry's step, the longest step, and its jitter. */
export interface Backoff {
  readonly baseMs: number;
  readonly capMs: number;
  readonly jitter: Jitter;
}

/**
 * Past 2^40 the step is far beyond any cap we allow, and 0 × 2^n stays 0
 * instead of becoming NaN once 2^n overflows to Infinity.
 */
const MAX_EXPONENT = 40;

/**
 * The one backoff of the apps (libs/client, which callers take without our
 * server libraries, keeps its own full-jitter one): the wait before retry `retry`, counted from
 * 0 for the first retry (a negative count is treated as 0). The step is
 * min(cap, base × 2^retry); `random` (uniform in [0, 1)) is drawn only when
 * there is jitter.
 */
export function backoffDelay(
  retry: number,
  { baseMs, capMs, jitter }: Backoff,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(retry, 0), MAX_EXPONENT);
  const step = Math.min(capMs, baseMs * 2 ** exponent);
  switch (jitter) {
    case 'none':
      return step;
    case 'full':
      return Math.floor(random() * step);
    case 'equal':
      return Math.round(step / 2 + random() * (step / 2));
  }
}
