import { describeIdempotencyStoreContract } from '@app/idempotency/testing/idempotency-store.contract';
import { PostgresIdempotencyStore } from '@app/persistence';
import { IdempotencySql } from '@app/persistence/idempotency/postgres-idempotency.sql';
import type { FramesRef } from '@app/idempotency';
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import type { DataSource, QueryRunner } from 'typeorm';
import { IdempotencyBytes1764892800000 } from '@app/persistence/migrations/1764892800000-idempotency-bytes';
import { eventually, freePort, testDatabaseUrl, testDataSource } from '../support/infra';

const newPool = (max = 10) =>
  new Pool({ connectionString: testDatabaseUrl(), max, application_name: 'idempotency-test' });

describeIdempotencyStoreContract('PostgresIdempotencyStore', async ({ idleCheckMs }) => {
  const pool = newPool();
  const store = new PostgresIdempotencyStore(pool, { idleCheckMs });
  return {
    store,
    teardown: async () => {
      await store.close();
      await pool.end();
    },
  };
});

describe('PostgresIdempotencyStore on PostgreSQL', () => {
  let ds: DataSource;
  let store: PostgresIdempotencyStore;
  const key = () => `tenant-a:POST:/v1/things:${randomUUID()}`;
  const rowOf = async (k: string) => (await ds.query(`SELECT * FROM idempotency_keys WHERE key = $1`, [k]))[0];
  const count = async (sql: string, params: unknown[] = []) => Number((await ds.query(sql, params))[0].n);
  /** Waits until the lock of `k`'s row has run out on the database clock (`locked_until < now()`). */
  const lockExpired = (k: string) =>
    eventually(
      async () =>
        (await count(`SELECT count(*) AS n FROM idempotency_keys WHERE key = $1 AND locked_until < now()`, [k])) === 1
          ? true
          : undefined,
      5000,
      `the lock of ${k} to run out`,
    );

  beforeAll(async () => {
    ds = await testDataSource();
    // The api builds it on its TypeORM DataSource; the contract above runs it on a plain Pool.
    store = new PostgresIdempotencyStore(ds, { idleCheckMs: 200 });
  });
  afterAll(async () => {
    await store.close();
    await ds.destroy();
  });

  it('keeps a running row with its lock, then the completed answer with the result TTL, on the database clock', async () => {
    const k = key();
    await store.claim(k, 'tok', 'fp', 30_000);
    const running = await rowOf(k);
    expect(running).toMatchObject({ state: 'running', token: 'tok', fingerprint: 'fp', status: null, body: null });
    const [{ lock_s, expires_s }] = await ds.query(
      `SELECT extract(epoch FROM locked_until - now()) AS lock_s, extract(epoch FROM expires_at - now()) AS expires_s FROM idempotency_keys WHERE key = $1`,
      [k],
    );
    expect(Number(lock_s)).toBeGreaterThan(29);
    // The row outlives the lock by a day: a request that died is known as such to the next.
    expect(Number(expires_s) - Number(lock_s)).toBeCloseTo(86_400, 0);

    await store.complete(
      k,
      'tok',
      'fp',
      { status: 202, headers: { location: '/x' }, body: Buffer.from('{"a":1}') },
      86_400_000,
    );
    expect(await rowOf(k)).toMatchObject({
      state: 'completed',
      token: null,
      fingerprint: 'fp',
      status: 202,
      headers: { location: '/x' },
      body: '{"a":1}',
      body_bytes: null,
      streamed: false,
      locked_until: null,
    });
    const [{ ttl_s }] = await ds.query(
      `SELECT extract(epoch FROM expires_at - now()) AS ttl_s FROM idempotency_keys WHERE key = $1`,
      [k],
    );
    expect(Number(ttl_s)).toBeGreaterThan(86_399);
    // No one followed and nothing streamed: no frame log at all.
    expect(await count(`SELECT count(*) AS n FROM idempotency_frames WHERE attempt = $1`, [running.attempt])).toBe(0);
  });

  it('keeps a streamed answer as a frame log under its attempt, living as long as the record', async () => {
    const k = key();
    await store.claim(k, 'tok', 'fp', 30_000);
    const head = { status: 200, headers: { 'content-type': 'text/event-stream' } };
    await store.frames.begin(k, 'tok', head);
    await store.frames.append(k, 'tok', ['data: 1\n\n', 'data: [DONE]\n\n']);
    await store.frames.complete(k, 'tok', 'fp', 3_600_000);
    const row = await rowOf(k);
    expect(row).toMatchObject({
      state: 'completed',
      status: 200,
      headers: head.headers,
      body: '',
      streamed: true,
    });
    const log = await ds.query(
      `SELECT seq, kind, data, extract(epoch FROM expires_at - now()) > 3599 AS lives FROM idempotency_frames WHERE attempt = $1 ORDER BY seq`,
      [row.attempt],
    );
    expect(log).toEqual([
      { seq: 0, kind: 'open', data: null, lives: true },
      { seq: 1, kind: 'head', data: JSON.stringify(head), lives: null },
      { seq: 2, kind: 'frame', data: 'data: 1\n\n', lives: null },
      { seq: 3, kind: 'frame', data: 'data: [DONE]\n\n', lives: null },
      { seq: 4, kind: 'end', data: 'completed', lives: null },
    ]);
  });

  it('keeps an answer as text where text can hold it, as bytes where it cannot, and replays rows written as text before', async () => {
    const text = key();
    const binary = key();
    const nul = Buffer.from('{"a":"\u0000"}\u0000');
    await store.claim(text, 't', 'fp', 30_000);
    await store.complete(text, 't', 'fp', { status: 200, headers: {}, body: Buffer.from('naïve ☃') }, 60_000);
    await store.claim(binary, 't', 'fp', 30_000);
    await store.complete(binary, 't', 'fp', { status: 200, headers: {}, body: nul }, 60_000);
    expect(await rowOf(text)).toMatchObject({ body: 'naïve ☃', body_bytes: null });
    expect(await rowOf(binary)).toMatchObject({ body: null, body_bytes: nul });
    // A row as the previous version wrote it (text only) replays as its UTF-8.
    const old = key();
    await ds.query(
      `INSERT INTO idempotency_keys (key, fingerprint, state, attempt, status, headers, body, started_at, expires_at)
       VALUES ($1, 'fp', 'completed', gen_random_uuid(), 201, '{}', 'écrit avant', now(), now() + interval '1 hour')`,
      [old],
    );
    await expect(store.claim(old, 't', 'fp', 30_000)).resolves.toEqual({
      outcome: 'completed',
      fingerprint: 'fp',
      response: { status: 201, headers: {}, body: Buffer.from('écrit avant') },
    });
    // Frames alike.
    const streamed = key();
    await store.claim(streamed, 't', 'fp', 30_000);
    await store.frames.begin(streamed, 't', { status: 200, headers: {} });
    await store.frames.append(streamed, 't', ['data: ☃\n\n', Buffer.from([0xff, 0x0a, 0x0a])]);
    const [{ attempt }] = await ds.query(`SELECT attempt FROM idempotency_keys WHERE key = $1`, [streamed]);
    expect(
      await ds.query(
        `SELECT data, data_bytes FROM idempotency_frames WHERE attempt = $1 AND kind = 'frame' ORDER BY seq`,
        [attempt],
      ),
    ).toEqual([
      { data: 'data: ☃\n\n', data_bytes: null },
      { data: null, data_bytes: Buffer.from([0xff, 0x0a, 0x0a]) },
    ]);
  });

  it('reads text back as text: a replay does not carry its body, or a follower its frames, as bytea (hex on the wire)', async () => {
    const k = key();
    await store.claim(k, 't', 'fp', 30_000);
    await store.complete(k, 't', 'fp', { status: 200, headers: {}, body: Buffer.from('naïve ☃') }, 60_000);
    const [replay] = await ds.query(IdempotencySql.claim, [k, 't2', 'fp', 30_000, randomUUID()]);
    expect(replay).toMatchObject({ claimed: false, state: 'completed', body: 'naïve ☃', body_bytes: null });
    const streamed = key();
    await store.claim(streamed, 't', 'fp', 30_000);
    await store.frames.begin(streamed, 't', { status: 200, headers: {} });
    await store.frames.append(streamed, 't', ['data: ☃\n\n']);
    const { attempt } = await rowOf(streamed);
    const page = await ds.query(IdempotencySql.read, [attempt, 0, 10]);
    expect(page.map((r: { kind: string; data: unknown }) => [r.kind, r.data])).toEqual([
      ['head', JSON.stringify({ status: 200, headers: {} })],
      ['frame', 'data: ☃\n\n'],
    ]);
  });

  it('replays the text of a row that holds both text and bytes (the previous version took it over and wrote text)', async () => {
    // Written by this version as bytes, taken over after its lock ended by the previous version (whose statements
    // know no body_bytes) and completed with text: the text is the answer.
    const k = key();
    await ds.query(
      `INSERT INTO idempotency_keys (key, fingerprint, state, attempt, status, headers, body, body_bytes, started_at, expires_at)
       VALUES ($1, 'fp', 'completed', gen_random_uuid(), 200, '{}', 'the later answer', '\\xff00'::bytea, now(), now() + interval '1 hour')`,
      [k],
    );
    await expect(store.claim(k, 't', 'fp', 30_000)).resolves.toEqual({
      outcome: 'completed',
      fingerprint: 'fp',
      response: { status: 200, headers: {}, body: Buffer.from('the later answer') },
    });
    // A frame likewise.
    const streamed = key();
    await store.claim(streamed, 't', 'fp', 30_000);
    await store.frames.begin(streamed, 't', { status: 200, headers: {} });
    await store.frames.append(streamed, 't', [Buffer.from([0xff])]);
    const { attempt } = await rowOf(streamed);
    await ds.query(`UPDATE idempotency_frames SET data = 'text' WHERE attempt = $1 AND kind = 'frame'`, [attempt]);
    await store.frames.complete(streamed, 't', 'fp', 60_000);
    const replay = await store.claim(streamed, 't2', 'fp', 30_000);
    const ref = replay.outcome === 'completed' ? replay.response.frames : undefined;
    expect(ref).toBeDefined();
    const frames: string[] = [];
    for await (const event of store.frames.follow(ref as FramesRef, new AbortController().signal)) {
      if (event.kind === 'frame') frames.push(event.data.toString('hex'));
    }
    expect(frames).toEqual([Buffer.from('text').toString('hex')]);
  });

  it('stores a body given as a string (a caller written for the text contract) as its UTF-8, rather than throw', async () => {
    const k = key();
    await store.claim(k, 't', 'fp', 30_000);
    const text = { status: 200, headers: {}, body: 'naïve ☃' as unknown as Buffer };
    await expect(store.complete(k, 't', 'fp', text, 60_000)).resolves.toBe(true);
    expect(await rowOf(k)).toMatchObject({ body: 'naïve ☃', body_bytes: null });
  });

  it('undoes the bytes migration forgetting only answers kept in bytes alone, not rows the previous version took over', async () => {
    const seedRow = (k: string, state: string, body: string | null, bytes: string | null, streamed = false) =>
      ds.query<{ attempt: string }[]>(
        `INSERT INTO idempotency_keys (key, fingerprint, state, token, attempt, status, headers, body, body_bytes, streamed,
                                       started_at, locked_until, expires_at)
         VALUES ($1, 'fp', $2, CASE WHEN $2 = 'running' THEN 't' END, gen_random_uuid(), 200, '{}', $3, $4::bytea, $5,
                 now(), CASE WHEN $2 = 'running' THEN now() + interval '1 minute' END, now() + interval '1 hour')
         RETURNING attempt`,
        [k, state, body, bytes, streamed],
      );
    const logOf = (attempt: string) =>
      ds.query(
        `INSERT INTO idempotency_frames (attempt, seq, kind, data, data_bytes, expires_at)
         VALUES ($1, 0, 'open', NULL, NULL, now() + interval '1 hour'), ($1, 1, 'frame', NULL, '\\xff'::bytea, NULL)`,
        [attempt],
      );
    const bytesOnly = key();
    const takenOverCompleted = key();
    const takenOverRunning = key();
    const streamedBytes = key();
    const streamingBytes = key();
    await seedRow(bytesOnly, 'completed', null, '\\xff');
    await seedRow(takenOverCompleted, 'completed', 'text of its own', '\\xff');
    await seedRow(takenOverRunning, 'running', null, '\\xff');
    await logOf((await seedRow(streamedBytes, 'completed', '', null, true))[0].attempt);
    await logOf((await seedRow(streamingBytes, 'running', null, null))[0].attempt);
    const all = [bytesOnly, takenOverCompleted, takenOverRunning, streamedBytes, streamingBytes];
    let left: string[] = [];
    class Undone extends Error {}
    // In a transaction that is rolled back: this suite's database keeps its schema.
    await ds
      .transaction(async (tx) => {
        await new IdempotencyBytes1764892800000().down(tx.queryRunner as QueryRunner);
        left = (await tx.query(`SELECT key FROM idempotency_keys WHERE key = ANY($1) ORDER BY key`, [all])).map(
          (r: { key: string }) => r.key,
        );
        throw new Undone();
      })
      .catch((err: unknown) => {
        if (!(err instanceof Undone)) throw err;
      });
    expect(left).toEqual([takenOverCompleted, takenOverRunning, streamingBytes].sort());
  });

  it('takes over a stale lock in the one claim statement: one winner of many, and the old holder is shut out', async () => {
    const k = key();
    await store.claim(k, 'old', 'fp', 100);
    const before = await rowOf(k);
    await lockExpired(k);
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => store.claim(k, `new-${i}`, 'fp', 10_000)));
    expect(results.filter((r) => r.outcome === 'claimed')).toHaveLength(1);
    expect(results.filter((r) => r.outcome === 'in-progress')).toHaveLength(19);
    const winner = results.findIndex((r) => r.outcome === 'claimed');
    expect(results[winner]).toEqual({ outcome: 'claimed', tookOver: true });
    const after = await rowOf(k);
    expect(after).toMatchObject({ state: 'running', token: `new-${winner}`, fingerprint: 'fp' });
    expect(after.attempt).not.toBe(before.attempt);
    expect(after.started_at.getTime()).toBeGreaterThan(before.started_at.getTime());
    await expect(store.renew(k, 'old', 10_000)).resolves.toBe(false);
    await expect(store.release(k, 'old')).resolves.toBe(false);
    await expect(
      store.complete(k, `new-${winner}`, 'fp', { status: 200, headers: {}, body: Buffer.from('ok') }, 60_000),
    ).resolves.toBe(true);
  });

  it('does not let a claim with another body take over a dead request: it sees the running record and its fingerprint until the row expires', async () => {
    const k = key();
    await store.claim(k, 'old', 'fp', 100);
    await lockExpired(k);
    // Whatever the dead request did is this key's: another body must not run under it.
    await expect(store.claim(k, 'other', 'fp2', 10_000)).resolves.toMatchObject({
      outcome: 'in-progress',
      fingerprint: 'fp',
    });
    expect(await rowOf(k)).toMatchObject({ state: 'running', token: 'old', fingerprint: 'fp' });
    // An abandoned key (outcome unknown) is the same: only its own body takes it over.
    await expect(store.claim(k, 'same', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed', tookOver: true });
    await expect(store.abandon(k, 'same')).resolves.toBe(true);
    await expect(store.claim(k, 'other', 'fp2', 10_000)).resolves.toMatchObject({
      outcome: 'in-progress',
      fingerprint: 'fp',
    });
    // Once the dead row expires (its retention), the key is free for any body.
    await ds.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, [k]);
    await expect(store.claim(k, 'other', 'fp2', 10_000)).resolves.toMatchObject({ outcome: 'claimed' });
  });

  it('follows through one LISTEN connection per store, however many follow', async () => {
    const keys = Array.from({ length: 10 }, () => key());
    const refs: FramesRef[] = [];
    for (const k of keys) {
      await store.claim(k, 't1', 'fp', 10_000);
      const c = await store.claim(k, 't2', 'fp', 10_000);
      if (c.outcome !== 'in-progress' || !c.frames) throw new Error('expected frames');
      refs.push(c.frames);
    }
    const stop = new AbortController();
    const followed = refs.map(async (ref) => {
      const events = [];
      for await (const e of store.frames.follow(ref, stop.signal)) events.push(e);
      return events;
    });
    // Each follower subscribes, reads, then registers (watched) on its key: once all ten have, all ten listen, and
    // the releases below write the end each one waits for.
    await eventually(
      async () =>
        (await count(`SELECT count(*) AS n FROM idempotency_keys WHERE key = ANY($1) AND watched`, [keys])) === 10
          ? true
          : undefined,
      10_000,
      'all ten followers registered',
    );
    expect(
      await count(
        `SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'idempotency-listen' AND datname = current_database()`,
      ),
    ).toBe(1);
    await Promise.all(keys.map((k) => store.release(k, 't1')));
    for (const events of await Promise.all(followed)) expect(events).toEqual([{ kind: 'end', outcome: 'aborted' }]);
    stop.abort();
  });

  describe('the sweep', () => {
    beforeEach(() => ds.query('TRUNCATE idempotency_keys, idempotency_frames'));

    async function seed(expired: number, live: number): Promise<void> {
      await ds.query(
        `INSERT INTO idempotency_keys (key, fingerprint, state, attempt, status, headers, body, started_at, expires_at)
         SELECT 'sweep:' || i, 'fp', 'completed', gen_random_uuid(), 200, '{}', 'b', now(),
                CASE WHEN i <= $1::int THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
         FROM generate_series(1, $1::int + $2::int) AS i`,
        [expired, live],
      );
    }

    it('deletes expired rows in batches of the given size and leaves live ones', async () => {
      await seed(1200, 30);
      // A running row whose holder died stays a day (the next request must
      // know it takes over), as a live lock does.
      await store.claim('sweep:dead', 'd', 'fp', 50);
      await store.claim('sweep:alive', 'a', 'fp', 60_000);
      await lockExpired('sweep:dead');
      expect((await store.sweepExpired(500)).keys).toBe(500);
      expect((await store.sweepExpired(500)).keys).toBe(500);
      expect((await store.sweepExpired(500)).keys).toBe(200);
      expect((await store.sweepExpired(500)).keys).toBe(0);
      expect(await count(`SELECT count(*) AS n FROM idempotency_keys`)).toBe(32);
      expect(await rowOf('sweep:alive')).toMatchObject({ state: 'running' });
      expect(await rowOf('sweep:dead')).toMatchObject({ state: 'running' });
      // A day on, it goes.
      await ds.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'sweep:dead'`);
      expect((await store.sweepExpired(500)).keys).toBe(1);
    });

    it("deletes a log once it expired: a dead holder's, a freed attempt's a minute on, a stored answer's with it", async () => {
      const head = { status: 200, headers: {} };
      // Died mid-stream: its log lives as long as its lock. The lock is long enough for the log to be written on
      // a busy machine, then made to have run out (a 50 ms lock could expire before begin() on a loaded CI).
      await store.claim('sweep:dead', 't', 'fp', 10_000);
      await store.frames.begin('sweep:dead', 't', head);
      await store.frames.append('sweep:dead', 't', ['a', 'b']);
      const [life] = await ds.query(
        `SELECT f.expires_at AS log, k.locked_until AS lock FROM idempotency_frames f
           JOIN idempotency_keys k ON f.attempt = k.attempt WHERE k.key = 'sweep:dead' AND f.seq = 0`,
      );
      expect(life.log).toEqual(life.lock);
      await ds.query(
        `UPDATE idempotency_frames f SET expires_at = now() - interval '1 second'
           FROM idempotency_keys k WHERE k.key = 'sweep:dead' AND f.attempt = k.attempt AND f.seq = 0`,
      );
      await ds.query(`UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = 'sweep:dead'`);
      // Freed mid-stream: its log (with the end marker) stays a minute for its followers.
      await store.claim('sweep:freed', 't', 'fp', 10_000);
      await store.frames.begin('sweep:freed', 't', head);
      await store.release('sweep:freed', 't');
      // Completed: its log lives with the record.
      await store.claim('sweep:done', 't', 'fp', 10_000);
      await store.frames.begin('sweep:done', 't', head);
      await store.frames.complete('sweep:done', 't', 'fp', 60_000);
      // The dead holder's log goes with its lock; its row stays (a day) for the next request to know.
      expect(await store.sweepExpired(500)).toEqual({ keys: 0, frameLogs: 1 });
      expect(await count(`SELECT count(*) AS n FROM idempotency_frames`)).toBe(6); // freed and done: open, head, end each
      await ds.query(`UPDATE idempotency_frames SET expires_at = now() - interval '1 second' WHERE seq = 0`);
      await ds.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`);
      expect(await store.sweepExpired(1)).toEqual({ keys: 1, frameLogs: 1 });
      expect(await store.sweepExpired(1)).toEqual({ keys: 1, frameLogs: 1 });
      expect(await store.sweepExpired(1)).toEqual({ keys: 0, frameLogs: 0 });
      expect(await count(`SELECT count(*) AS n FROM idempotency_frames`)).toBe(0);
    });

    it('deletes everything that expired, however much, and nothing live: a sweep at a time, each within its budget', async () => {
      // 25,000 expired rows: past the 10,000 a periodic sweep once took at most (20 batches of 500), which made the
      // table grow for ever past ~167 keyed requests a second per instance. A sweep stops at its budget (20
      // batches) and says there is more; the next one goes on.
      await seed(25_000, 40);
      await ds.query(
        `INSERT INTO idempotency_frames (attempt, seq, kind, data, expires_at)
         SELECT gen_random_uuid(), 0, 'open', NULL,
                CASE WHEN i <= 1200 THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
         FROM generate_series(1, 1210) AS i`,
      );
      expect(await store.sweep()).toEqual({ keys: 10_000, frameLogs: 1200, more: true });
      expect(await count(`SELECT count(*) AS n FROM idempotency_keys`)).toBe(15_040);
      expect(await store.sweep()).toEqual({ keys: 10_000, frameLogs: 0, more: true });
      expect(await store.sweep()).toEqual({ keys: 5_000, frameLogs: 0, more: false });
      expect(await count(`SELECT count(*) AS n FROM idempotency_keys WHERE expires_at <= now()`)).toBe(0);
      expect(await count(`SELECT count(*) AS n FROM idempotency_keys`)).toBe(40);
      expect(await count(`SELECT count(*) AS n FROM idempotency_frames`)).toBe(10);
    });

    it('sweeps at once when started, and again at once while a sweep leaves more, not an interval later', async () => {
      const pool = newPool(2);
      // An interval no test waits for: only the first sweep and the ones that follow it at once can run.
      const sweeper = new PostgresIdempotencyStore(pool, { sweepIntervalMs: 600_000, sweepBatch: 100, sweepBudget: 2 });
      try {
        await seed(1000, 5); // five sweeps of two batches
        sweeper.startSweeping();
        await eventually(
          async () => ((await count(`SELECT count(*) AS n FROM idempotency_keys`)) === 5 ? true : undefined),
          10_000,
          'the sweeps',
        );
      } finally {
        await sweeper.close();
        await pool.end();
      }
    });

    it('sweeps nothing once closed', async () => {
      const pool = newPool(2);
      const sweeper = new PostgresIdempotencyStore(pool, { sweepBatch: 100 });
      try {
        await seed(10, 0);
        await sweeper.close();
        expect(await sweeper.sweep()).toEqual({ keys: 0, frameLogs: 0, more: false });
        expect(await count(`SELECT count(*) AS n FROM idempotency_keys`)).toBe(10);
      } finally {
        await sweeper.close();
        await pool.end();
      }
    });

    it('sweeps periodically once started, until closed', async () => {
      const pool = newPool(2);
      const sweeper = new PostgresIdempotencyStore(pool, { sweepIntervalMs: 50, sweepBatch: 100 });
      try {
        await seed(450, 5);
        sweeper.startSweeping();
        await eventually(
          async () => ((await count(`SELECT count(*) AS n FROM idempotency_keys`)) === 5 ? true : undefined),
          5000,
          'the sweep',
        );
        await sweeper.close();
        await ds.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`);
        // The moment has passed once another sweeper on the same interval, started now, has swept three times (its
        // sweeps counted, not run): a timer close() left running, due before its, would have fired in between.
        const clock = new PostgresIdempotencyStore(pool, { sweepIntervalMs: 50, sweepBatch: 100 });
        const ticks = jest.spyOn(clock, 'sweepExpired').mockResolvedValue({ keys: 0, frameLogs: 0 });
        try {
          clock.startSweeping();
          await eventually(() => (ticks.mock.calls.length >= 3 ? true : undefined), 5000, "the later sweeper's sweeps");
        } finally {
          await clock.close();
        }
        expect(await count(`SELECT count(*) AS n FROM idempotency_keys`)).toBe(5);
      } finally {
        await sweeper.close();
        await pool.end();
      }
    });
  });

  it('fails closed: every operation rejects when PostgreSQL cannot be reached', async () => {
    const pool = new Pool({
      connectionString: `postgres://postgres@127.0.0.1:${freePort(7)}/nowhere`,
      connectionTimeoutMillis: 1000,
    });
    pool.on('error', () => undefined);
    const down = new PostgresIdempotencyStore(pool);
    const k = key();
    try {
      await expect(down.claim(k, 't', 'fp', 1000)).rejects.toThrow();
      await expect(
        down.complete(k, 't', 'fp', { status: 200, headers: {}, body: Buffer.alloc(0) }, 1000),
      ).rejects.toThrow();
      await expect(down.release(k, 't')).rejects.toThrow();
      await expect(down.renew(k, 't', 1000)).rejects.toThrow();
      await expect(down.frames.begin(k, 't', { status: 200, headers: {} })).rejects.toThrow();
      await expect(down.frames.append(k, 't', ['x'])).rejects.toThrow();
      await expect(down.frames.complete(k, 't', 'fp', 1000)).rejects.toThrow();
      const follow = async () => {
        for await (const _ of down.frames.follow(`${randomUUID()}:${k}` as FramesRef, new AbortController().signal))
          void _;
      };
      await expect(follow()).rejects.toThrow();
      await expect(down.sweepExpired()).rejects.toThrow();
    } finally {
      await down.close();
      await pool.end();
    }
  });

  it('says it took over a request that died, and not a fresh key or an expired answer; abandon leaves the key as a dead one', async () => {
    const fresh = key();
    await expect(store.claim(fresh, 't1', 'fp', 100)).resolves.toEqual({ outcome: 'claimed' });
    await new Promise((r) => setTimeout(r, 250));
    await expect(store.claim(fresh, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed', tookOver: true });
    const answered = key();
    await store.claim(answered, 't1', 'fp', 10_000);
    await store.complete(answered, 't1', 'fp', { status: 200, headers: {}, body: Buffer.from('{}') }, 100);
    await new Promise((r) => setTimeout(r, 250));
    await expect(store.claim(answered, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed' });
    const given = key();
    await store.claim(given, 't1', 'fp', 10_000);
    await expect(store.abandon(given, 't1')).resolves.toBe(true);
    await expect(store.abandon(given, 't1')).resolves.toBe(false);
    await expect(store.claim(given, 't2', 'fp', 10_000)).resolves.toEqual({ outcome: 'claimed', tookOver: true });
  });
});
