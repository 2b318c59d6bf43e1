/** Runs remembered per route: enough for a stable 90th percentile, few enough to follow a change. */
const SAMPLES = 64;

/**
 * How long the recent runs of each route took, in this process: what a
 * duplicate that finds its key running should expect. Keyed by the route's
 * handler, so the set is as bounded as the routes.
 */
export class HandlerDurations {
  private readonly byHandler = new WeakMap<object, { readonly samples: number[]; next: number }>();

  record(handler: object, ms: number): void {
    let entry = this.byHandler.get(handler);
    if (!entry) {
      entry = { samples: [], next: 0 };
      this.byHandler.set(handler, entry);
    }
    entry.samples[entry.next] = ms;
    entry.next = (entry.next + 1) % SAMPLES;
  }

  /** The 90th percentile of the route's last runs, or undefined before its first. */
  typical(handler: object): number | undefined {
    const samples = this.byHandler.get(handler)?.samples;
    if (!samples?.length) return undefined;
    const sorted = [...samples].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.9))];
  }
}

/**
 * Retry-After, in whole seconds, for a duplicate of a request that is still
 * running: when a retry is likely to find its answer (the route's typical run
 * less what this one has run already), at least 1 s, and never past the
 * lock's expiry, when the key frees even if that request died. Without a
 * typical run to go by, 1 s: most handlers take milliseconds, and a retry
 * that comes too early is only told again.
 */
export function retryAfterSeconds(
  running: { readonly runningForMs: number; readonly expiresInMs: number },
  typicalMs: number | undefined,
): number {
  const untilExpiry = Math.max(1, Math.floor(running.expiresInMs / 1000));
  const remainingMs = (typicalMs ?? 0) - running.runningForMs;
  return Math.min(untilExpiry, Math.max(1, Math.ceil(remainingMs / 1000)));
}
