import { EventEmitter, once } from 'node:events';

/**
 * At most `capacity` jobs at once, each holding its slot, by entry id, until
 * its work settles. Whoever waits for a slot is woken when one frees up (or
 * by wake(), when shutdown begins).
 */
export class SlotLimiter<T> {
  private readonly running = new Map<string, Promise<T>>();
  private readonly freed = new EventEmitter().setMaxListeners(0);

  constructor(private readonly capacity: number) {}

  get size(): number {
    return this.running.size;
  }

  get free(): number {
    return this.capacity - this.running.size;
  }

  has(id: string): boolean {
    return this.running.has(id);
  }

  ids(): string[] {
    return [...this.running.keys()];
  }

  /** Holds a slot for `id` until `work` settles; returns `work`, settling after the slot is free. */
  hold(id: string, work: Promise<T>): Promise<T> {
    const held = work.finally(() => {
      this.running.delete(id);
      this.wake();
    });
    this.running.set(id, held);
    return held;
  }

  /** Resolves when everything running now has settled. */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.running.values()]);
  }

  /** Resolves when a slot frees up, or after `timeoutMs` at the latest. */
  async slotFreed(timeoutMs: number): Promise<void> {
    // A cleared timer, not AbortSignal.timeout: a slot usually frees long before, and each wait would leave its timer
    // behind.
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), timeoutMs);
    try {
      await once(this.freed, 'freed', { signal: deadline.signal }).catch(() => undefined);
    } finally {
      clearTimeout(timer);
    }
  }

  wake(): void {
    this.freed.emit('freed');
  }
}
