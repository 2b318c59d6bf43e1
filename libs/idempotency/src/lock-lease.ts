import type { IdempotencyStore } from './idempotency-store.interface';

/**
 * Keeps a running request's lock alive: renews it every third of the TTL
 * while the handler runs, only while the token is still ours. The TTL is
 * short (it is how long a request that died holds its key), so a live one
 * renews with two thirds of it left: a renewal that is late (a busy event
 * loop) or fails still leaves time for the next. A renewal error (Redis
 * blipped) is retried soon, not a third of a TTL later; a refusal means the
 * lock was lost.
 *
 * The lease is what knows the lock was lost: `lost` once a renewal was
 * refused, and `refused()` for a refusal the store gave the request's settle.
 */
export class LockLease {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private lostOnRenewal = false;

  /**
   * @param onLost the lock was lost: `how` says what the store refused ('renewal refused', or a settle's)
   * @param quiet true while a refused renewal is expected (the record was completed in the handler's
   *   transaction): the lease is then lost but nothing is reported
   */
  constructor(
    private readonly store: IdempotencyStore,
    private readonly key: string,
    private readonly token: string,
    private readonly ttlMs: number,
    private readonly onLost: (how: string) => void,
    private readonly onError: (err: unknown) => void,
    private readonly quiet: () => boolean = () => false,
  ) {
    this.schedule();
  }

  /** True once a renewal was refused: another request holds the key now, and that was reported then. */
  get lost(): boolean {
    return this.lostOnRenewal;
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /**
   * The store refused a write under this lease's token (`how`: 'finalise
   * refused', 'release refused', ...): reported as the lock lost, unless a
   * renewal already found it lost. Each such refusal is reported.
   */
  refused(how: string): void {
    if (!this.lostOnRenewal) this.onLost(how);
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
        this.lostOnRenewal = true;
        this.stop();
        if (!this.quiet()) this.onLost('renewal refused');
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
