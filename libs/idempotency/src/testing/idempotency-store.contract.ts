import { randomUUID } from 'node:crypto';
import type { IdempotencyStore, StoredResponse } from '../idempotency-store.interface';

export interface StoreUnderTest {
  readonly store: IdempotencyStore;
  teardown(): Promise<void>;
}

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The semantics every IdempotencyStore must have. Run it against each
 * implementation with a real backend: `describeIdempotencyStoreContract('redis', setup)`.
 */
export function describeIdempotencyStoreContract(name: string, setup: () => Promise<StoreUnderTest>): void {
  describe(`IdempotencyStore contract: ${name}`, () => {
    let sut: StoreUnderTest;
    let store: IdempotencyStore;
    const key = () => `tenant:POST:/contract:${randomUUID()}`;
    const response: StoredResponse = {
      status: 201,
      headers: { location: '/things/1', 'content-type': 'application/json; charset=utf-8' },
      body: JSON.stringify({ id: 1, note: 'naïve ☃ — "quoted"\n' }),
    };

    beforeAll(async () => {
      sut = await setup();
      store = sut.store;
    });
    afterAll(() => sut.teardown());

    it('lets the first claim win and shows the others the running record', async () => {
      const k = key();
      await expect(store.claim(k, 't1', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
      const second = await store.claim(k, 't2', 'fp-other', 10_000);
      expect(second).toMatchObject({ outcome: 'in-progress', fingerprint: 'fp' });
      if (second.outcome !== 'in-progress') throw new Error('unreachable');
      expect(second.expiresInMs).toBeGreaterThan(9_000);
      expect(second.expiresInMs).toBeLessThanOrEqual(10_000);
      expect(second.runningForMs).toBeGreaterThanOrEqual(0);
      expect(second.runningForMs).toBeLessThan(1_000);
    });

    it("tells how long the holder has run, on the store's clock", async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await wait(300);
      const later = await store.claim(k, 't2', 'fp', 10_000);
      if (later.outcome !== 'in-progress') throw new Error(`expected in-progress, got ${later.outcome}`);
      expect(later.runningForMs).toBeGreaterThanOrEqual(250);
      expect(later.runningForMs).toBeLessThan(2_000);
      // Renewing extends the lock, not the start: the time run keeps counting.
      await store.renew(k, 't1', 10_000);
      const renewed = await store.claim(k, 't3', 'fp', 10_000);
      if (renewed.outcome !== 'in-progress') throw new Error(`expected in-progress, got ${renewed.outcome}`);
      expect(renewed.runningForMs).toBeGreaterThanOrEqual(later.runningForMs);
      expect(renewed.expiresInMs).toBeGreaterThan(9_000);
    });

    it('gives exactly one of many simultaneous claims the lock', async () => {
      const k = key();
      const results = await Promise.all(Array.from({ length: 50 }, (_, i) => store.claim(k, `t${i}`, 'fp', 10_000)));
      expect(results.filter((r) => r.outcome === 'claimed')).toHaveLength(1);
      expect(results.filter((r) => r.outcome === 'in-progress')).toHaveLength(49);
    });

    it('stores the answer of the lock holder and returns it byte for byte', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await expect(store.complete(k, 't1', 'fp', response, 60_000)).resolves.toBe(true);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toEqual({
        outcome: 'completed',
        fingerprint: 'fp',
        response,
      });
    });

    it('stores an empty body', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await store.complete(k, 't1', 'fp', { status: 204, headers: {}, body: '' }, 60_000);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toEqual({
        outcome: 'completed',
        fingerprint: 'fp',
        response: { status: 204, headers: {}, body: '' },
      });
    });

    it('refuses to complete, release or renew with a token that is not the holder', async () => {
      const k = key();
      await store.claim(k, 'holder', 'fp', 10_000);
      await expect(store.complete(k, 'intruder', 'fp', response, 60_000)).resolves.toBe(false);
      await expect(store.release(k, 'intruder')).resolves.toBe(false);
      await expect(store.renew(k, 'intruder', 10_000)).resolves.toBe(false);
      await expect(store.claim(k, 'other', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'in-progress' });
    });

    it('frees the key on release by the holder', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await expect(store.release(k, 't1')).resolves.toBe(true);
      await expect(store.claim(k, 't2', 'fp2', 10_000)).resolves.toEqual({ outcome: 'claimed' });
    });

    it('keeps a renewed lock past its first TTL', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 300);
      await wait(200);
      await expect(store.renew(k, 't1', 300)).resolves.toBe(true);
      await wait(200);
      await expect(store.claim(k, 't2', 'fp', 300)).resolves.toMatchObject({ outcome: 'in-progress' });
    });

    it('lets another request take over an expired lock, and never lets the old holder overwrite it', async () => {
      const k = key();
      await store.claim(k, 'old', 'fp', 100);
      await wait(250);
      await expect(store.claim(k, 'new', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
      await expect(store.renew(k, 'old', 10_000)).resolves.toBe(false);
      await expect(store.complete(k, 'old', 'fp', { ...response, body: 'old' }, 60_000)).resolves.toBe(false);
      await expect(store.release(k, 'old')).resolves.toBe(false);
      await expect(store.complete(k, 'new', 'fp', response, 60_000)).resolves.toBe(true);
      await expect(store.claim(k, 'later', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'completed', response });
    });

    it('does not let the holder touch the record once it is completed', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await store.complete(k, 't1', 'fp', response, 60_000);
      await expect(store.release(k, 't1')).resolves.toBe(false);
      await expect(store.renew(k, 't1', 10_000)).resolves.toBe(false);
      await expect(store.complete(k, 't1', 'fp', { ...response, body: 'again' }, 60_000)).resolves.toBe(false);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'completed', response });
    });

    it('forgets a completed answer after its result TTL', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await store.complete(k, 't1', 'fp', response, 150);
      await wait(300);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
    });

    it('keeps keys apart', async () => {
      const a = key();
      const b = key();
      await store.claim(a, 't1', 'fp', 10_000);
      await expect(store.claim(b, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
      await expect(store.release(b, 't1')).resolves.toBe(false);
    });
  });
}
