import type { IdempotencyStore } from './idempotency-store.interface';

/**
 * Keeps a running request's lock alive: renews it every third of the TTL
 * while the handler runs, only while the token is still ours. The TTL is
 * short (it is how long a request that died holds its key), so a live one
 * renews with two thirds of it left: a renewal that is late (a busy event
 * loop) or fails still leaves time for the next. A renewal error (Redis
 * blipped) is retried soon, not a third of a TTL later; a refusal means the
 * lock was lost.
 */
export class LockLease {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  lost = false;

  constructor(
    private readonly store: IdempotencyStore,
    private readonly key: string,
    private readonly token: string,
    private readonly ttlMs: number,
    private readonly onLost: () => void,
    private readonly onError: (err: unknown) => void,
  ) {
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  private schedule(afterError = false): void {
    if (this.stopped) return;
    // After an error: an eighth of the TTL, at most a second, so several tries
    // fit in the two thirds of the TTL the lock has left.
    const delay = afterError ? Math.min(1000, this.ttlMs / 8) : this.ttlMs / 3;
    this.timer = setTimeout(() => void this.renew(), Math.max(1, Math.floor(delay)));
    this.timer.unref();
  }

  private async renew(): Promise<void> {
    try {
      const ours = await this.store.renew(this.key, this.token, this.ttlMs);
      if (!ours && !this.stopped) {
        this.lost = true;
        this.stop();
        this.onLost();
        return;
      }
    } catch (err) {
      this.onError(err);
      this.schedule(true);
      return;
    }
    this.schedule();
  }
}
