import { randomUUID } from 'node:crypto';
import type {
  ClaimResult,
  FrameEvent,
  FramesRef,
  IdempotencyFrameLog,
  IdempotencyStore,
  StoredResponse,
} from '../idempotency-store.interface';

export interface StoreUnderTest {
  readonly store: IdempotencyStore;
  teardown(): Promise<void>;
}

/** How the contract asks for its stores to be built. */
export interface StoreContractOptions {
  /**
   * How long a follower waits for news before it looks again (the store's idle check). The wake-up cases ask
   * for one far beyond their patience, so a follower that only an idle check would find out waits them out:
   * build the store with it, or those cases cannot tell a woken follower from a polling one.
   */
  readonly idleCheckMs: number;
}

/** An idle check no case waits for: a follower of a store built with it learns of news only by being woken. */
const NEVER_MS = 600_000;

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every event of a follow, until it ends or `ms` pass (then the events so far, and a 'timeout' marker). */
async function collect(
  log: IdempotencyFrameLog,
  ref: FramesRef,
  ms = 5000,
): Promise<(FrameEvent | { kind: 'timeout' })[]> {
  const out: (FrameEvent | { kind: 'timeout' })[] = [];
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), ms);
  try {
    for await (const event of log.follow(ref, stop.signal)) out.push(event);
  } finally {
    clearTimeout(timer);
  }
  if (stop.signal.aborted) out.push({ kind: 'timeout' });
  return out;
}

/** A frame event as a follower gets it: its bytes. */
const frameOf = (data: string | Buffer): FrameEvent => ({ kind: 'frame', data: Buffer.from(data) });

function framesOf(claim: ClaimResult): FramesRef {
  if (claim.outcome === 'in-progress' && claim.frames) return claim.frames;
  if (claim.outcome === 'completed' && claim.response.frames) return claim.response.frames;
  throw new Error(`no frames in ${JSON.stringify(claim)}`);
}

/**
 * The semantics every IdempotencyStore must have. Run it against each
 * implementation with a real backend: `describeIdempotencyStoreContract('redis', setup)`. It builds two
 * stores with `setup`, both alive at once: one with a one-second idle check, one whose idle check never
 * comes. A setup that takes no options would build the second like the first, and a store that only polls
 * would pass the wake-up cases: those cases fail instead, saying so.
 */
export function describeIdempotencyStoreContract(
  name: string,
  setup: (options: StoreContractOptions) => Promise<StoreUnderTest>,
): void {
  describe(`IdempotencyStore contract: ${name}`, () => {
    let sut: StoreUnderTest;
    let store: IdempotencyStore;
    const key = () => `tenant:POST:/contract:${randomUUID()}`;
    const response: StoredResponse = {
      status: 201,
      headers: { location: '/things/1', 'content-type': 'application/json; charset=utf-8' },
      body: Buffer.from(JSON.stringify({ id: 1, note: 'naïve ☃ — "quoted"\n' })),
    };

    beforeAll(async () => {
      sut = await setup({ idleCheckMs: 1000 });
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

    it('peeks at a record as a claim would see it, and takes nothing', async () => {
      if (!store.peek) return; // optional: a store without it serves no reader of others' records
      const k = key();
      await expect(store.peek(k)).resolves.toEqual({ outcome: 'absent' });
      // Peeking takes nothing: the key is still free for a claim.
      await expect(store.claim(k, 't1', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
      const running = await store.peek(k);
      expect(running).toMatchObject({ outcome: 'in-progress', fingerprint: 'fp' });
      if (running.outcome === 'in-progress' && store.frames) expect(running.frames).toBeDefined();
      await store.complete(k, 't1', 'fp', response, 60_000);
      await expect(store.peek(k)).resolves.toEqual({ outcome: 'completed', fingerprint: 'fp', response });
      const freed = key();
      await store.claim(freed, 't1', 'fp', 10_000);
      await store.release(freed, 't1');
      await expect(store.peek(freed)).resolves.toEqual({ outcome: 'absent' });
      // A dead holder's lapsed lock is free for a claim, and so absent to a peek.
      const lapsed = key();
      await store.claim(lapsed, 't1', 'fp', 200);
      await wait(400);
      await expect(store.peek(lapsed)).resolves.toEqual({ outcome: 'absent' });
    });

    it('stores an empty body', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await store.complete(k, 't1', 'fp', { status: 204, headers: {}, body: Buffer.alloc(0) }, 60_000);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toEqual({
        outcome: 'completed',
        fingerprint: 'fp',
        response: { status: 204, headers: {}, body: Buffer.alloc(0) },
      });
    });

    it.each([
      ['a NUL', Buffer.from('{"text":"a\u0000b"}\u0000', 'utf8')],
      ['bytes that are not UTF-8', Buffer.from([0x7b, 0xff, 0xfe, 0x00, 0xc3, 0x7d])],
      // A 4-byte character (a surrogate pair in a JS string) beside an invalid byte: neither may split the other.
      [
        'a 4-byte character beside an invalid byte',
        Buffer.concat([Buffer.from('😀'), Buffer.from([0xff]), Buffer.from('😀')]),
      ],
      ['a real U+FFFD beside an invalid byte', Buffer.concat([Buffer.from('\uFFFD ok '), Buffer.from([0x80])])],
      ['a real U+FFFD alone', Buffer.from('replacement \uFFFD character')],
    ])('stores a body holding %s and returns its bytes exactly', async (_, body) => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      const binary: StoredResponse = { status: 200, headers: { 'content-type': 'application/octet-stream' }, body };
      await expect(store.complete(k, 't1', 'fp', binary, 60_000)).resolves.toBe(true);
      const replay = await store.claim(k, 't2', 'fp', 10_000);
      if (replay.outcome !== 'completed') throw new Error(`expected completed, got ${replay.outcome}`);
      expect(replay.response.body.equals(body)).toBe(true);
      expect(replay).toEqual({ outcome: 'completed', fingerprint: 'fp', response: binary });
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
      // Only the renewal keeps it past 500 ms: a renewal that did nothing leaves a lock that lapsed before the
      // claim below, however slow the machine (a pause of the whole first TTL between claim and renew fails it).
      await store.claim(k, 't1', 'fp', 500);
      await expect(store.renew(k, 't1', 60_000)).resolves.toBe(true);
      const renewed = await store.claim(k, 't2', 'fp', 300);
      expect(renewed).toMatchObject({ outcome: 'in-progress' });
      if (renewed.outcome === 'in-progress') expect(renewed.expiresInMs).toBeGreaterThan(30_000);
      await wait(700);
      await expect(store.claim(k, 't3', 'fp', 300)).resolves.toMatchObject({ outcome: 'in-progress' });
    });

    it('lets another request take over an expired lock, and never lets the old holder overwrite it', async () => {
      const k = key();
      await store.claim(k, 'old', 'fp', 100);
      await wait(250);
      // A store that can tell says it took over (tookOver: true); Redis cannot (the record vanished).
      await expect(store.claim(k, 'new', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'claimed' });
      await expect(store.renew(k, 'old', 10_000)).resolves.toBe(false);
      await expect(store.complete(k, 'old', 'fp', { ...response, body: Buffer.from('old') }, 60_000)).resolves.toBe(
        false,
      );
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
      await expect(store.complete(k, 't1', 'fp', { ...response, body: Buffer.from('again') }, 60_000)).resolves.toBe(
        false,
      );
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'completed', response });
    });

    it('forgets a completed answer after its result TTL', async () => {
      const k = key();
      await store.claim(k, 't1', 'fp', 10_000);
      await store.complete(k, 't1', 'fp', response, 150);
      await wait(300);
      await expect(store.claim(k, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
    });

    describe('frames (streamed answers)', () => {
      const head = { status: 200, headers: { 'content-type': 'text/event-stream; charset=utf-8' } };
      const frames = ['data: {"a":1}\n\n', 'data: naïve ☃ "q"\r\n\r\n', '', 'data: [DONE]\n\n'];
      let log: IdempotencyFrameLog;
      beforeAll(() => {
        if (!store.frames) throw new Error('this store keeps no frames');
        log = store.frames;
      });

      it('stores a streamed answer frame by frame and replays it byte for byte, with its head', async () => {
        const k = key();
        await store.claim(k, 't1', 'fp', 10_000);
        await expect(log.begin(k, 't1', head)).resolves.toBe(true);
        await expect(log.append(k, 't1', frames.slice(0, 2))).resolves.toBe(true);
        await expect(log.append(k, 't1', frames.slice(2))).resolves.toBe(true);
        await expect(log.complete(k, 't1', 'fp', 60_000)).resolves.toBe(true);
        const claim = await store.claim(k, 't2', 'fp', 10_000);
        expect(claim).toMatchObject({
          outcome: 'completed',
          fingerprint: 'fp',
          response: { status: 200, headers: head.headers, body: Buffer.alloc(0) },
        });
        expect(await collect(log, framesOf(claim))).toEqual([
          { kind: 'head', head },
          ...frames.map(frameOf),
          { kind: 'end', outcome: 'completed' },
        ]);
      });

      it('stores frames of any bytes (a NUL, bytes that are not UTF-8) and replays them exactly', async () => {
        const k = key();
        const binary = [
          Buffer.from('data: {"a":"\u0000"}\n\n'),
          Buffer.from([0x64, 0x3a, 0x20, 0xff, 0xfe, 0x00, 0xc3, 0x0a, 0x0a]),
          Buffer.from('data: \uFFFD\n\n'),
        ];
        await store.claim(k, 't1', 'fp', 10_000);
        await log.begin(k, 't1', head);
        // A live follower gets them as they are appended, and a replay afterwards.
        const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
        await expect(log.append(k, 't1', binary)).resolves.toBe(true);
        await log.complete(k, 't1', 'fp', 60_000);
        const expected = [{ kind: 'head', head }, ...binary.map(frameOf), { kind: 'end', outcome: 'completed' }];
        expect(await followed).toEqual(expected);
        const replayed = await collect(log, framesOf(await store.claim(k, 't3', 'fp', 10_000)));
        expect(replayed).toEqual(expected);
        const frames = replayed.flatMap((e) => (e.kind === 'frame' ? [e.data] : []));
        expect(Buffer.concat(frames).equals(Buffer.concat(binary))).toBe(true);
      });

      it('says gone to a follower of a request that ended before it came, or that died', async () => {
        const k = key();
        await store.claim(k, 't1', 'fp', 10_000);
        const ref = framesOf(await store.claim(k, 't2', 'fp', 10_000));
        await store.release(k, 't1');
        expect(await collect(log, ref)).toEqual([{ kind: 'gone' }]);

        const dying = key();
        await store.claim(dying, 't1', 'fp', 300);
        await log.begin(dying, 't1', head);
        await log.append(dying, 't1', [frames[0]]);
        const events = await collect(log, framesOf(await store.claim(dying, 't2', 'fp', 300)), 8000);
        expect(events).toEqual([{ kind: 'head', head }, frameOf(frames[0]), { kind: 'gone' }]);
      });

      it('keeps the frames of a renewed lock past its first TTL', async () => {
        const k = key();
        await store.claim(k, 't1', 'fp', 500);
        await log.begin(k, 't1', head);
        await log.append(k, 't1', [frames[0]]);
        await expect(store.renew(k, 't1', 60_000)).resolves.toBe(true);
        await wait(700);
        await log.complete(k, 't1', 'fp', 60_000);
        const events = await collect(log, framesOf(await store.claim(k, 't2', 'fp', 300)));
        expect(events.map((e) => e.kind)).toEqual(['head', 'frame', 'end']);
      });

      it('appends the last frames with the completion (completeWith), after the others, for followers and replays', async () => {
        if (!log.completeWith) return;
        const k = key();
        const last = [Buffer.from([0x64, 0x3a, 0x20, 0xff, 0x0a, 0x0a]), frames[3]];
        await store.claim(k, 't1', 'fp', 10_000);
        await log.begin(k, 't1', head);
        const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
        await log.append(k, 't1', frames.slice(0, 2));
        await expect(log.completeWith(k, 't1', 'fp', 60_000, last)).resolves.toBe(true);
        const expected = [
          { kind: 'head', head },
          ...[...frames.slice(0, 2), ...last].map(frameOf),
          { kind: 'end', outcome: 'completed' },
        ];
        expect(await followed).toEqual(expected);
        expect(await collect(log, framesOf(await store.claim(k, 't3', 'fp', 10_000)))).toEqual(expected);
      });

      it('refuses frames from a token that is not the holder', async () => {
        const k = key();
        await store.claim(k, 'holder', 'fp', 10_000);
        await expect(log.begin(k, 'intruder', head)).resolves.toBe(false);
        await expect(log.append(k, 'intruder', frames)).resolves.toBe(false);
        await expect(log.complete(k, 'intruder', 'fp', 60_000)).resolves.toBe(false);
        if (log.completeWith) await expect(log.completeWith(k, 'intruder', 'fp', 60_000, frames)).resolves.toBe(false);
        await expect(store.claim(k, 'other', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'in-progress' });
        // Nothing of the intruder's reached the log: the holder's own answer is all it holds.
        await log.begin(k, 'holder', head);
        await log.append(k, 'holder', [frames[0]]);
        await log.complete(k, 'holder', 'fp', 60_000);
        const events = await collect(log, framesOf(await store.claim(k, 'after', 'fp', 10_000)));
        expect(events).toEqual([{ kind: 'head', head }, frameOf(frames[0]), { kind: 'end', outcome: 'completed' }]);
      });

      it.each([['a}b'], ['{}x}'], ['{tag}'], ['a{b'], ['}{x}'], ['{a}b}'], ['x}y{z']])(
        'keeps a key with braces (%j) whole: claim, frames, followers, completion and release',
        async (braces) => {
          const k = `tenant:POST:/contract:${braces}${randomUUID()}`;
          await expect(store.claim(k, 't1', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
          await expect(log.begin(k, 't1', head)).resolves.toBe(true);
          const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
          await wait(50);
          await expect(log.append(k, 't1', [frames[0]])).resolves.toBe(true);
          await expect(store.renew(k, 't1', 10_000)).resolves.toBe(true);
          await expect(log.complete(k, 't1', 'fp', 60_000)).resolves.toBe(true);
          expect((await followed).map((e) => e.kind)).toEqual(['head', 'frame', 'end']);
          const replay = await store.claim(k, 't3', 'fp', 10_000);
          expect((await collect(log, framesOf(replay))).map((e) => e.kind)).toEqual(['head', 'frame', 'end']);
          const other = `${k}-whole`;
          await store.claim(other, 't1', 'fp', 10_000);
          await expect(
            store.complete(other, 't1', 'fp', { status: 200, headers: {}, body: Buffer.from('ok') }, 60_000),
          ).resolves.toBe(true);
          await store.claim(`${other}-freed`, 't1', 'fp', 10_000);
          await expect(store.release(`${other}-freed`, 't1')).resolves.toBe(true);
        },
      );

      describe('whose followers are woken, not polled', () => {
        // A second store, whose idle check never comes: a follower that is not woken by the news waits out the case.
        let woken: StoreUnderTest;
        let store: IdempotencyStore;
        let log: IdempotencyFrameLog;
        beforeAll(async () => {
          if (setup.length === 0)
            throw new Error(
              'setup takes no options: build the store with the idleCheckMs it is given ({ idleCheckMs }), ' +
                'or these cases cannot tell a woken follower from a polling one',
            );
          woken = await setup({ idleCheckMs: NEVER_MS });
          store = woken.store;
          if (!store.frames) throw new Error('this store keeps no frames');
          log = store.frames;
        });
        afterAll(() => woken.teardown());

        it('lets a follower read the frames so far, then the live ones, to the end', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          await log.begin(k, 't1', head);
          await log.append(k, 't1', [frames[0]]);
          const ref = framesOf(await store.claim(k, 't2', 'fp', 10_000));
          const followed = collect(log, ref);
          await wait(100);
          await log.append(k, 't1', [frames[1]]);
          await wait(100);
          await log.append(k, 't1', [frames[3]]);
          await log.complete(k, 't1', 'fp', 60_000);
          expect(await followed).toEqual([
            { kind: 'head', head },
            frameOf(frames[0]),
            frameOf(frames[1]),
            frameOf(frames[3]),
            { kind: 'end', outcome: 'completed' },
          ]);
        });

        it('tells a follower that came before the first frame about the head and everything after it', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
          await wait(100);
          await log.begin(k, 't1', head);
          await log.append(k, 't1', frames);
          await log.complete(k, 't1', 'fp', 60_000);
          expect((await followed).map((e) => e.kind)).toEqual(['head', 'frame', 'frame', 'frame', 'frame', 'end']);
        });

        it('tells a follower that an answer is relayed only (not storable), and frees the key at its release', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          await log.begin(k, 't1', { ...head, storable: false });
          const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
          await store.release(k, 't1');
          expect(await followed).toEqual([
            { kind: 'head', head: { ...head, storable: false } },
            { kind: 'end', outcome: 'aborted' },
          ]);
          await expect(store.claim(k, 't3', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
        });

        it('ends followers with aborted when the holder frees the key, and keeps the next attempt apart', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          await log.begin(k, 't1', head);
          await log.append(k, 't1', [frames[0]]);
          const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
          await wait(100);
          await expect(store.release(k, 't1')).resolves.toBe(true);
          expect(await followed).toEqual([
            { kind: 'head', head },
            frameOf(frames[0]),
            { kind: 'end', outcome: 'aborted' },
          ]);
          await expect(store.claim(k, 't3', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
          await log.begin(k, 't3', head);
          await log.append(k, 't3', [frames[1]]);
          await log.complete(k, 't3', 'fp', 60_000);
          const replayed = await collect(log, framesOf(await store.claim(k, 't4', 'fp', 10_000)));
          expect(replayed).toEqual([{ kind: 'head', head }, frameOf(frames[1]), { kind: 'end', outcome: 'completed' }]);
        });

        it('tells a follower at once when the request ends with a whole answer instead', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          const followed = collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)));
          // A follower that first looks after the completion finds no frames and hears `gone`: it is given a
          // second to start following (no idle check can answer for it on this store, so waiting hides nothing).
          await wait(1000);
          await store.complete(k, 't1', 'fp', response, 60_000);
          // Not woken, it would wait out collect's patience and end with a 'timeout' marker.
          expect(await followed).toEqual([{ kind: 'end', outcome: 'completed' }]);
          await expect(store.claim(k, 't3', 'fp', 10_000)).resolves.toMatchObject({ outcome: 'completed', response });
        });

        it('stops following, without an event, when the signal aborts', async () => {
          const k = key();
          await store.claim(k, 't1', 'fp', 10_000);
          await log.begin(k, 't1', head);
          // A follower deaf to its signal would wait for the idle check that never comes, past the case's timeout.
          expect(await collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)), 300)).toEqual([
            { kind: 'head', head },
            { kind: 'timeout' },
          ]);
        });

        it('serves many followers at once, each its own frames', async () => {
          const keys = Array.from({ length: 40 }, () => key());
          for (const k of keys) {
            await store.claim(k, 't1', 'fp', 10_000);
            await log.begin(k, 't1', head);
          }
          const followed = Promise.all(
            keys.map(async (k) => collect(log, framesOf(await store.claim(k, 't2', 'fp', 10_000)))),
          );
          await wait(200);
          await Promise.all(
            keys.map(async (k, i) => {
              await log.append(k, 't1', [`data: ${i}\n\n`]);
              await log.complete(k, 't1', 'fp', 60_000);
            }),
          );
          const all = await followed;
          all.forEach((events, i) =>
            expect(events).toEqual([
              { kind: 'head', head },
              frameOf(`data: ${i}\n\n`),
              { kind: 'end', outcome: 'completed' },
            ]),
          );
        });

        it('wakes each of many followers on other keys with its frame', async () => {
          const keys = Array.from({ length: 24 }, () => key());
          for (const k of keys) {
            await store.claim(k, 't1', 'fp', 10_000);
            await log.begin(k, 't1', head);
          }
          // A follower that missed the news waits for an idle check that never comes: the patience ends them all.
          const stop = new AbortController();
          const patience = setTimeout(() => stop.abort(), 10_000);
          const seen = keys.map(async (k) => {
            for await (const event of log.follow(framesOf(await store.claim(k, 't2', 'fp', 10_000)), stop.signal))
              if (event.kind === 'frame') return event.data.toString();
            return 'not woken';
          });
          await wait(300); // the followers are waiting, most likely, so the frames below are news to them
          const got: string[] = [];
          try {
            for (const [i, k] of keys.entries()) {
              await log.append(k, 't1', [`data: ${i}\n\n`]);
              got.push(await seen[i]);
            }
          } finally {
            clearTimeout(patience);
            stop.abort();
          }
          for (const k of keys) await log.complete(k, 't1', 'fp', 60_000);
          expect(got).toEqual(keys.map((_, i) => `data: ${i}\n\n`));
        });
      });
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
