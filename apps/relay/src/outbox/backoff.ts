/**
 * The wait before the next try after `failures` failed attempts (1 for the
 * first failure): equal jitter on a capped exponential,
 *
 *   d = min(cap, base * 2^(failures - 1));  wait = d/2 + random * d/2
 *
 * Half of the step is kept so a row never comes back at once to a provider
 * that is down (full jitter can draw ~0), and the other half is random so the
 * rows of one failed batch do not come back together.
 *
 * The relay's one backoff: a row's next try (OutboxRelay, OUTBOX_BACKOFF_*)
 * and the LISTEN connection's next reconnect (OutboxListener).
 */
export function retryDelayMs(
  failures: number,
  baseMs: number,
  capMs: number,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(failures - 1, 0), 40);
  const step = Math.min(capMs, baseMs * 2 ** exponent);
  return Math.round(step / 2 + random() * (step / 2));
}
