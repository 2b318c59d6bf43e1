export interface MicroBatcherOptions<I, O> {
  /** Runs one batch; resolves with one result per item, in the items' order. */
  readonly run: (items: readonly I[]) => Promise<readonly O[]>;
  /** The most items in one batch. */
  readonly maxBatch: number;
  /** The most batches running at once; what comes meanwhile waits and goes in the next. */
  readonly maxInFlight: number;
  /**
   * Items that share a key never share a batch: the later one waits for a
   * later batch (which may run while the earlier one's still does, up to
   * maxInFlight).
   */
  readonly keys?: (item: I) => readonly string[];
  /**
   * When a batch of several fails with an error this accepts (true: any),
   * each of its items runs again on its own, so one item that cannot be
   * written fails only itself. Otherwise every item of the batch gets the
   * batch's error: a database that is down is not asked once per item.
   */
  readonly isolateFailures?: boolean | ((error: unknown) => boolean);
}

interface Waiting<I, O> {
  readonly item: I;
  readonly resolve: (value: O) => void;
  readonly reject: (reason: unknown) => void;
}

/**
 * Group commit: what concurrent callers submit while a batch runs, and what
 * they submit in the same turn of the event loop, runs as one batch (one
 * statement, one script) instead of one each. An idle batcher adds no wait
 * but the rest of the current turn (setImmediate): a caller alone still runs
 * at once, callers in a crowd share a round trip. Each caller gets its own
 * item's result, or its error.
 */
export class MicroBatcher<I, O> {
  private waiting: Waiting<I, O>[] = [];
  private running = 0;
  private scheduled = false;

  constructor(private readonly options: MicroBatcherOptions<I, O>) {
    if (!(options.maxBatch >= 1) || !(options.maxInFlight >= 1))
      throw new Error('MicroBatcher: maxBatch and maxInFlight must be at least 1');
  }

  /** Items waiting for a batch (not the ones running). */
  get waitingCount(): number {
    return this.waiting.length;
  }

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.waiting.push({ item, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled || this.running >= this.options.maxInFlight || this.waiting.length === 0) return;
    this.scheduled = true;
    // The rest of this turn first: the callers woken by the same I/O join the batch.
    setImmediate(() => {
      this.scheduled = false;
      this.drain();
    });
  }

  private drain(): void {
    while (this.running < this.options.maxInFlight && this.waiting.length > 0) {
      const batch = this.take();
      this.running++;
      void this.runBatch(batch).finally(() => {
        this.running--;
        this.schedule();
      });
    }
  }

  /** The next batch, in submission order, skipping (for later) an item whose key is already in it. */
  private take(): Waiting<I, O>[] {
    const { keys, maxBatch } = this.options;
    if (!keys) return this.waiting.splice(0, maxBatch);
    const batch: Waiting<I, O>[] = [];
    const later: Waiting<I, O>[] = [];
    const taken = new Set<string>();
    for (const w of this.waiting) {
      const own = batch.length < maxBatch ? keys(w.item) : undefined;
      if (own && !own.some((k) => taken.has(k))) {
        for (const k of own) taken.add(k);
        batch.push(w);
      } else later.push(w);
    }
    this.waiting = later;
    return batch;
  }

  private async runBatch(batch: readonly Waiting<I, O>[]): Promise<void> {
    try {
      settle(batch, await this.results(batch));
    } catch (err) {
      const { isolateFailures } = this.options;
      const isolate = typeof isolateFailures === 'function' ? isolateFailures(err) : isolateFailures === true;
      if (!isolate || batch.length === 1) {
        for (const w of batch) w.reject(err);
        return;
      }
      await Promise.all(
        batch.map(async (w) => {
          try {
            settle([w], await this.results([w]));
          } catch (own) {
            w.reject(own);
          }
        }),
      );
    }
  }

  private async results(batch: readonly Waiting<I, O>[]): Promise<readonly O[]> {
    const results = await this.options.run(batch.map((w) => w.item));
    if (results.length !== batch.length)
      throw new Error(`MicroBatcher: a batch of ${batch.length} came back with ${results.length} results`);
    return results;
  }
}

function settle<I, O>(batch: readonly Waiting<I, O>[], results: readonly O[]): void {
  for (let i = 0; i < batch.length; i++) batch[i].resolve(results[i]);
}
