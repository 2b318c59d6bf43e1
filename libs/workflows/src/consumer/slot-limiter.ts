import { EventEmitter, once } from 'node:events';

/**
 * Slots set aside by SlotLimiter.reserve for one read: each job the read
 * returns takes one (hold), and release() gives back what it did not use.
 */
export interface SlotReservation<T> {
  /** Reserved slots not yet taken by a job. */
  readonly remaining: number;
  /** Like SlotLimiter.hold, on one of the reserved slots; throws when none is left. */
  hold(id: string, work: Promise<T>): Promise<T>;
  /** Gives back the slots no job took (idempotent); waiters wake. */
  release(): void;
}

/**
 * At most `capacity` jobs at once, each holding its slot, by id, until its
 * work settles, or until it says that only its writes are left (finishing):
 * then its slot goes to the next entry while it commits and acks, up to
 * `capacity` finishing jobs besides the running ones (a database that stalls
 * commits stops new work there, rather than piling up finished work without
 * bound). A finishing job is still in flight (size, ids, settled: leases and
 * drain see it). Readers that share it (one loop per stream partition) reserve
 * slots before they read, so that what they read together never exceeds the
 * capacity. Whoever waits for a slot is woken when one frees up (or by wake(),
 * when shutdown begins).
 */
export class SlotLimiter<T> {
  private readonly running = new Map<string, Promise<T>>();
  /** Jobs of `running` whose slot was handed on: only their writes are left. */
  private readonly finishingIds = new Set<string>();
  private readonly freed = new EventEmitter().setMaxListeners(0);
  private reserved = 0;
  /** Readers waiting for their turn, first come first served. */
  private readonly turns: object[] = [];

  constructor(private readonly capacity: number) {}

  get size(): number {
    return this.running.size;
  }

  /** Slots neither running a job (a finishing one holds none) nor reserved for a read. */
  get free(): number {
    return this.capacity - (this.running.size - this.finishingIds.size) - this.reserved;
  }

  /**
   * `id`'s work is done but for its writes (its commit, its ack): its slot
   * frees for the next entry, if fewer than `capacity` jobs are finishing
   * already (else it keeps its slot until it settles). Once per job; a job
   * not running is ignored.
   */
  finishing(id: string): void {
    if (!this.running.has(id) || this.finishingIds.has(id) || this.finishingIds.size >= this.capacity) return;
    this.finishingIds.add(id);
    this.wake();
  }

  /**
   * Sets aside up to `max` free slots (possibly none: `remaining` says) for a read about to be made. A `reader`
   * (one partition's loop) that finds no free slot takes its turn: until it has had slots, readers behind it get
   * none, so a loop that keeps giving back and taking again cannot keep the others out for ever.
   */
  reserve(max: number, reader?: object): SlotReservation<T> {
    let left = Math.max(0, Math.min(max, this.free));
    if (reader !== undefined) left = this.take(reader, left);
    this.reserved += left;
    const release = (n: number): void => {
      left -= n;
      this.reserved -= n;
    };
    return {
      get remaining() {
        return left;
      },
      hold: (id, work) => {
        if (left <= 0) throw new RangeError('no reserved slot left');
        release(1);
        return this.hold(id, work);
      },
      release: () => {
        if (left === 0) return;
        release(left);
        this.wake();
      },
    };
  }

  /** How many of `available` slots `reader` may have now, keeping the turns. */
  private take(reader: object, available: number): number {
    const at = this.turns.indexOf(reader);
    const first = this.turns.length === 0 || at === 0;
    if (!first || available === 0) {
      if (at < 0) this.turns.push(reader);
      return 0;
    }
    if (at === 0) this.turns.shift();
    // Slots are left and someone is next: wake the readers, so that the next in turn takes them now.
    if (this.turns.length > 0 && this.free - available > 0) queueMicrotask(() => this.wake());
    return available;
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
      // A finishing job's slot was free already: nothing more frees.
      if (!this.finishingIds.delete(id)) this.wake();
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
