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
