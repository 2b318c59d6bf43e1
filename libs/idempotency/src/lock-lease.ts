import type { IdempotencyStore } from './idempotency-store.interface';

/**
 * Keeps a running request's lock alive: renews it every half TTL while the
 * handler runs, only while the token is still ours. Renewal errors (Redis
 * blipped) are retried at the next tick; a refusal means the lock was lost.
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

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.renew(), Math.max(1, Math.floor(this.ttlMs / 2)));
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
    }
    this.schedule();
  }
}
