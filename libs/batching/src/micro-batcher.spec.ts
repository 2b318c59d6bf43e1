import { MicroBatcher } from './micro-batcher';

/** A run that records its batches and answers when told to. */
function recorder(fail?: (items: readonly string[]) => Error | undefined) {
  const batches: string[][] = [];
  const gates: (() => void)[] = [];
  const run = async (items: readonly string[]): Promise<string[]> => {
    batches.push([...items]);
    await new Promise<void>((resolve) => gates.push(resolve));
    const error = fail?.(items);
    if (error) throw error;
    return items.map((i) => i.toUpperCase());
  };
  const openAll = async (): Promise<void> => {
    // Each opened batch may start the next: open until nothing waits.
    for (let i = 0; i < 50; i++) {
      await new Promise((r) => setImmediate(r));
      gates.splice(0).forEach((open) => open());
    }
  };
  return { batches, run, openAll };
}

describe('MicroBatcher', () => {
  it('runs the items submitted in one turn as one batch, each caller getting its own result', async () => {
    const r = recorder();
    const b = new MicroBatcher({ run: r.run, maxBatch: 10, maxInFlight: 1 });
    const results = Promise.all(['a', 'b', 'c'].map((i) => b.submit(i)));
    await r.openAll();
    await expect(results).resolves.toEqual(['A', 'B', 'C']);
    expect(r.batches).toEqual([['a', 'b', 'c']]);
  });

  it('collects what comes while a batch runs into the next one, up to maxBatch', async () => {
    const r = recorder();
    const b = new MicroBatcher({ run: r.run, maxBatch: 2, maxInFlight: 1 });
    const first = b.submit('a');
    await new Promise((res) => setImmediate(res)); // 'a' runs alone
    const rest = ['b', 'c', 'd', 'e', 'f'].map((i) => b.submit(i));
    expect(b.waitingCount).toBe(5);
    await r.openAll();
    await expect(Promise.all([first, ...rest])).resolves.toEqual(['A', 'B', 'C', 'D', 'E', 'F']);
    expect(r.batches).toEqual([['a'], ['b', 'c'], ['d', 'e'], ['f']]);
  });

  it('runs up to maxInFlight batches at once', async () => {
    const r = recorder();
    const b = new MicroBatcher({ run: r.run, maxBatch: 1, maxInFlight: 2 });
    const all = Promise.all(['a', 'b', 'c'].map((i) => b.submit(i)));
    await new Promise((res) => setImmediate(res));
    expect(r.batches).toEqual([['a'], ['b']]);
    await r.openAll();
    await all;
    expect(r.batches).toEqual([['a'], ['b'], ['c']]);
  });

  it('never puts two items with a key in common in one batch, and keeps the order of the rest', async () => {
    const r = recorder();
    const b = new MicroBatcher({ run: r.run, maxBatch: 10, maxInFlight: 1, keys: (i: string) => [i[0]] });
    const all = Promise.all(['x1', 'y1', 'x2', 'z1', 'x3'].map((i) => b.submit(i)));
    await r.openAll();
    await expect(all).resolves.toEqual(['X1', 'Y1', 'X2', 'Z1', 'X3']);
    expect(r.batches).toEqual([['x1', 'y1', 'z1'], ['x2'], ['x3']]);
  });

  it('with isolateFailures, a failed batch runs each item alone: only the bad one fails', async () => {
    const r = recorder((items) => (items.includes('bad') ? new Error(`refused ${items.join(',')}`) : undefined));
    const b = new MicroBatcher({ run: r.run, maxBatch: 10, maxInFlight: 1, isolateFailures: true });
    const outcomes = Promise.allSettled(['a', 'bad', 'c'].map((i) => b.submit(i)));
    await r.openAll();
    const settled = await outcomes;
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason.message).toBe('refused bad');
    expect(r.batches).toEqual([['a', 'bad', 'c'], ['a'], ['bad'], ['c']]);
  });

  it('isolateFailures as a predicate: an error it refuses fails every item at once, with no run each', async () => {
    const down = Object.assign(new Error('down'), { transient: true });
    const r = recorder(() => down);
    const b = new MicroBatcher({
      run: r.run,
      maxBatch: 10,
      maxInFlight: 1,
      isolateFailures: (err) => !(err as { transient?: boolean }).transient,
    });
    const outcomes = Promise.allSettled(['a', 'b', 'c'].map((i) => b.submit(i)));
    await r.openAll();
    expect((await outcomes).map((s) => (s as PromiseRejectedResult).reason)).toEqual([down, down, down]);
    expect(r.batches).toEqual([['a', 'b', 'c']]);
  });

  it('without isolateFailures, every item of a failed batch gets its error', async () => {
    const r = recorder(() => new Error('down'));
    const b = new MicroBatcher({ run: r.run, maxBatch: 10, maxInFlight: 1 });
    const outcomes = Promise.allSettled(['a', 'b'].map((i) => b.submit(i)));
    await r.openAll();
    expect((await outcomes).map((s) => (s as PromiseRejectedResult).reason?.message)).toEqual(['down', 'down']);
    expect(r.batches).toEqual([['a', 'b']]);
  });

  it('a run that answers with the wrong number of results fails its batch', async () => {
    const b = new MicroBatcher({ run: async () => ['one'], maxBatch: 10, maxInFlight: 1 });
    await expect(Promise.all([b.submit('a'), b.submit('b')])).rejects.toThrow(/batch of 2 came back with 1/);
  });

  it('refuses a maxBatch or maxInFlight below 1', () => {
    expect(() => new MicroBatcher({ run: async () => [], maxBatch: 0, maxInFlight: 1 })).toThrow(/at least 1/);
    expect(() => new MicroBatcher({ run: async () => [], maxBatch: 1, maxInFlight: 0 })).toThrow(/at least 1/);
  });
});
