import { SlotLimiter } from './slot-limiter';

describe('SlotLimiter', () => {
  it('a job holds its slot, by entry id, until its work settles, failures included', async () => {
    const slots = new SlotLimiter<string>(2);
    let finish!: (v: string) => void;
    let fail!: (e: Error) => void;
    const a = slots.hold('1-0', new Promise<string>((r) => (finish = r)));
    const b = slots.hold('2-0', new Promise<string>((_, r) => (fail = r)));
    expect([slots.size, slots.free, slots.has('1-0'), slots.ids()]).toEqual([2, 0, true, ['1-0', '2-0']]);

    finish('done');
    await expect(a).resolves.toBe('done');
    expect([slots.size, slots.free, slots.has('1-0')]).toEqual([1, 1, false]);

    fail(new Error('boom'));
    await expect(b).rejects.toThrow('boom');
    expect([slots.size, slots.free, slots.ids()]).toEqual([0, 2, []]);
  });

  it('a waiter wakes when a slot frees up, or after its timeout at the latest', async () => {
    jest.useFakeTimers();
    try {
      const slots = new SlotLimiter<void>(1);
      let finish!: () => void;
      void slots.hold('1-0', new Promise<void>((r) => (finish = r)));

      // No timer is advanced: the slot freeing is what ends the wait.
      const waiting = slots.slotFreed(10_000);
      finish();
      await waiting;

      let timedOut = false;
      const waitingLonger = slots.slotFreed(50).then(() => (timedOut = true));
      await jest.advanceTimersByTimeAsync(49);
      expect(timedOut).toBe(false);
      await jest.advanceTimersByTimeAsync(1);
      await waitingLonger;
      expect(timedOut).toBe(true);
      expect(jest.getTimerCount()).toBe(0);
    } finally {
      jest.useRealTimers();
    }
  });

  it('wake() ends every wait at once; settled() waits for everything running now', async () => {
    const slots = new SlotLimiter<void>(1);
    const waits = [slots.slotFreed(10_000), slots.slotFreed(10_000)];
    slots.wake();
    await Promise.all(waits);

    let finish!: () => void;
    let settled = false;
    void slots.hold('1-0', new Promise<void>((r) => (finish = r)));
    const all = slots.settled().then(() => (settled = true));
    await new Promise((r) => setImmediate(r));
    expect(settled).toBe(false);
    finish();
    await all;
    expect(settled).toBe(true);
  });
});

describe('SlotLimiter reservations', () => {
  it('a reservation takes free slots for a read; jobs use them; what the read did not use goes back', async () => {
    const slots = new SlotLimiter<void>(4);
    const a = slots.reserve(3);
    expect([a.remaining, slots.free]).toEqual([3, 1]);
    // Another reader gets only what is left.
    const b = slots.reserve(3);
    expect([b.remaining, slots.free]).toEqual([1, 0]);
    expect(slots.reserve(1).remaining).toBe(0);

    let finish!: () => void;
    const job = a.hold('0/1-0', new Promise<void>((r) => (finish = r)));
    expect([a.remaining, slots.size, slots.free]).toEqual([2, 1, 0]);
    a.release();
    a.release(); // idempotent
    expect([a.remaining, slots.free]).toEqual([0, 2]);
    expect(() => a.hold('0/2-0', Promise.resolve())).toThrow(RangeError);

    b.release();
    expect(slots.free).toBe(3);
    finish();
    await job;
    expect([slots.size, slots.free]).toEqual([0, 4]);
  });

  it('releasing wakes a reader waiting for a slot', async () => {
    const slots = new SlotLimiter<void>(1);
    const r = slots.reserve(1);
    const waiting = slots.slotFreed(10_000);
    r.release();
    await waiting;
    expect(slots.free).toBe(1);
  });

  it('readers that find no free slot take turns: one that gives back and takes again cannot keep another out', () => {
    const slots = new SlotLimiter<string>(1);
    const [a, b] = [{}, {}];
    const first = slots.reserve(1, a);
    expect(first.remaining).toBe(1);
    expect(slots.reserve(1, b).remaining).toBe(0); // b waits its turn
    first.release();
    // a is back first, but b's turn comes before a's next one.
    expect(slots.reserve(1, a).remaining).toBe(0);
    const second = slots.reserve(1, b);
    expect(second.remaining).toBe(1);
    second.release();
    expect(slots.reserve(1, a).remaining).toBe(1);
  });

  it('a reader without a turn to keep (one loop) always gets what is free', () => {
    const slots = new SlotLimiter<string>(2);
    const r = slots.reserve(5);
    expect(r.remaining).toBe(2);
    r.release();
    expect(slots.reserve(1).remaining).toBe(1);
  });

  it('a finishing job gives its slot to the next one, up to `capacity` finishing at once, and stays in flight', async () => {
    const slots = new SlotLimiter<void>(1);
    const ends = [Promise.withResolvers<void>(), Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    const a = slots.hold('a', ends[0].promise);
    slots.finishing('a');
    // Its slot is free; it is still in flight (leases, drain).
    expect([slots.free, slots.size, slots.has('a')]).toEqual([1, 1, true]);
    const b = slots.hold('b', ends[1].promise);
    slots.finishing('b');
    // One finishing job already (the capacity): b keeps its slot.
    expect([slots.free, slots.size]).toEqual([0, 2]);
    ends[0].resolve();
    await a;
    expect([slots.free, slots.size]).toEqual([0, 1]);
    // Once a finished, b may finish too: its slot frees, and a job that settles frees nothing twice.
    slots.finishing('b');
    expect(slots.free).toBe(1);
    const c = slots.hold('c', ends[2].promise);
    ends[1].resolve();
    await b;
    expect([slots.free, slots.size, slots.ids()]).toEqual([0, 1, ['c']]);
    slots.finishing('nope');
    expect(slots.free).toBe(0);
    ends[2].resolve();
    await c;
    expect([slots.free, slots.size]).toEqual([1, 0]);
  });
});
