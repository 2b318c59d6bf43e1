import { IdempotencyProblemTypes } from '@app/idempotency';
import { Client } from 'pg';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { refundIdFor } from '../../apps/api/src/refunds/refunds.service';
import { TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { FakePaymentsServer } from '../support/fake-payments-server';
import { eventually, freePort, testDatabaseUrl, testDataSource, testRedisUrl } from '../support/infra';
import { metricValue } from '../support/metrics';
import {
  attemptRows,
  keyRecord,
  lookupsFor,
  paidAnswer,
  paidRow,
  payoutPostsFor,
  refundOperation,
  refundRows,
} from '../support/refunds';

/** Short, so that the key of a request that was killed is free a couple of seconds later. */
const LOCK_TTL_S = 2;

/**
 * The built api as an operator runs it, SIGKILLed in the middle of a refund
 * (no shutdown hook, no release, no rollback it could run itself), then
 * started again with the same environment. The guarantee: the retry with the
 * same key finds the payout the dead process made, by lookup, and records
 * it: one payout at the provider, one `refunds` row, the key completed, and
 * the send mark (`refund_attempts`, committed before the payout left) gone.
 *
 * Where the kill lands is made deterministic, not timed:
 * - between the provider's answer and the commit: the test holds
 *   `LOCK TABLE refunds IN ACCESS EXCLUSIVE MODE` in an open transaction, so
 *   the api's INSERT of the row waits on it; the kill comes once
 *   pg_stat_activity shows the api's backend waiting on that lock, blocked
 *   by the test's connection (the provider has answered by then);
 * - while the payout is at the provider: the fake holds it (gate), the
 *   payout registered on arrival, the answer never sent before the kill.
 */
describe('refunds: the api process killed mid-refund, then restarted', () => {
  let fake: FakePaymentsServer;
  let ds: DataSource;
  let env: Record<string, string>;
  const port = freePort(94);
  const procs: AppProcess[] = [];

  beforeAll(async () => {
    fake = await new FakePaymentsServer().start();
    ds = await testDataSource();
    env = {
      REDIS_URL: testRedisUrl(),
      DATABASE_URL: testDatabaseUrl(),
      API_KEYS: `${TENANT_A.tenant}:${TENANT_A.key}`,
      LOG_LEVEL: 'warn',
      PAYMENTS_URL: fake.url(),
      PAYMENTS_TIMEOUT_S: '5',
      IDEMPOTENCY_LOCK_TTL_S: String(LOCK_TTL_S),
    };
  });
  afterEach(async () => {
    for (const p of procs.splice(0)) {
      p.kill('SIGKILL');
      await p.exited;
    }
  });
  afterAll(async () => {
    await fake?.stop();
    await ds?.destroy();
  });

  const start = async (): Promise<AppProcess> => {
    const p = await startAppProcess('api', port, env);
    procs.push(p);
    return p;
  };
  const kill = async (p: AppProcess): Promise<void> => {
    p.kill('SIGKILL');
    expect(await p.exited).toEqual({ code: null, signal: 'SIGKILL' });
  };

  const refundBody = (tag: string) => ({
    ticket_id: `T-${tag}`,
    order_id: `ord-${tag}`,
    amount: 4200,
    currency: 'EUR',
  });
  const operationOf = (key: string) => refundOperation(TENANT_A.tenant, key);
  const post = (p: AppProcess, key: string, body: object) =>
    fetch(`${p.url}/v1/refunds`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TENANT_A.key}`, 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(body),
    });
  const rowsOf = (refundId: string) => refundRows(ds, refundId);
  const recordOf = (key: string) => keyRecord(ds, operationOf(key));

  /**
   * Retries as a client would, same key and body, on the restarted api: a
   * 409 while the dead request's lock holds; once its row shows the lock
   * ended (locked_until <= now(), PostgreSQL's clock), the answer. An answer
   * before that must be that 409, and a 409 after it fails.
   */
  const retryUntilAnswered = async (
    p: AppProcess,
    key: string,
    body: object,
  ): Promise<{ res: Response; conflicts: number }> => {
    const res = await post(p, key, body);
    if (res.status !== 409) return { res, conflicts: 0 };
    const problem = (await res.json()) as { type: string };
    expect(problem.type).toBe(IdempotencyProblemTypes.inProgress);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    await eventually(
      async () => ((await recordOf(key))?.lock_expired === false ? undefined : true),
      LOCK_TTL_S * 1000 + 10_000,
      "the dead request's lock to expire",
    );
    return { res: await post(p, key, body), conflicts: 1 };
  };

  /**
   * Starts the api and sends it `key`'s refund, whose payout the fake holds
   * (registered on arrival, answered once `answerPayout` is called); returns
   * once the payout has arrived. `first` settles with the api's answer, or
   * with the error of a connection that dropped.
   */
  const sendWithPayoutHeld = async (key: string, body: ReturnType<typeof refundBody>) => {
    const api = await start();
    let answerPayout!: () => void;
    const gate = new Promise<void>((resolve) => (answerPayout = resolve));
    fake.nextPayouts({ kind: 'gate', gate });
    const arrived = fake.payoutRequests().length;
    const first = post(api, key, body).then(
      (r) => r,
      (err: unknown) => err as Error,
    );
    await fake.arrivals(arrived + 1);
    expect(fake.payoutsFor(refundIdFor(operationOf(key)))).toHaveLength(1);
    return { api, first, answerPayout };
  };

  /** The send mark the dead process left: committed before its payout left, one send, the refund's facts. */
  const expectMarkLeft = async (key: string, body: ReturnType<typeof refundBody>): Promise<void> => {
    const refundId = refundIdFor(operationOf(key));
    expect(await attemptRows(ds, refundId)).toEqual([
      expect.objectContaining({
        refund_id: refundId,
        tenant: TENANT_A.tenant,
        ticket_id: body.ticket_id,
        order_id: body.order_id,
        amount: body.amount,
        currency: body.currency,
        sends: 1,
      }),
    ]);
  };

  /** The effects every scenario ends with: one payout (by lookup), one row, the key completed and replayed, no mark. */
  const expectRecordedOnce = async (
    p: AppProcess,
    key: string,
    body: ReturnType<typeof refundBody>,
    res: Response,
  ): Promise<void> => {
    const refundId = refundIdFor(operationOf(key));
    const payouts = fake.payoutsFor(refundId);
    expect(payouts).toHaveLength(1);
    expect(payouts[0]).toMatchObject({
      reference: refundId,
      order_id: body.order_id,
      amount: body.amount,
      currency: body.currency,
    });
    // The restarted api did not pay again: the only paying POST is the dead process's.
    expect(payoutPostsFor(fake, refundId)).toHaveLength(1);
    // It asked the provider instead: the recovery's one lookup (the dead process never got to its own).
    expect(lookupsFor(fake, refundId)).toHaveLength(1);

    expect(res.status).toBe(201);
    const answer = (await res.json()) as Record<string, unknown>;
    const expected = paidAnswer(refundId, body, payouts[0].payout_id);
    expect(answer).toEqual(expected);
    expect(res.headers.get('location')).toBe(`/v1/refunds/${refundId}`);

    expect(await rowsOf(refundId)).toEqual([paidRow(refundId, TENANT_A.tenant, body, payouts[0].payout_id)]);
    const record = await recordOf(key);
    expect(record).toMatchObject({ state: 'completed', status: 201, token: null });
    expect(JSON.parse(record!.body!)).toEqual(expected);
    // Recorded: the send mark went with it.
    expect(await attemptRows(ds, refundId)).toEqual([]);
    expect(await metricValue(p.url, 'refunds_total', { outcome: 'found' })).toBe(1);

    // And from now on it is a plain replay: nothing more at the provider.
    const lookups = fake.lookupRequests().length;
    const replay = await post(p, key, body);
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.json()).toEqual(expected);
    expect(fake.payoutsFor(refundId)).toHaveLength(1);
    expect(fake.lookupRequests()).toHaveLength(lookups);
    expect(await rowsOf(refundId)).toHaveLength(1);
  };

  it('SIGKILL between the provider’s answer and the commit: the retry on the restarted api finds the payout by lookup; one payout, one row', async () => {
    const key = `refund-kill-commit-${randomUUID()}`;
    const body = refundBody(randomUUID().slice(0, 8));
    const refundId = refundIdFor(operationOf(key));
    // The payout is held at the provider until the test holds the table lock:
    // the api's read of `refunds` (is it already recorded?) comes before the
    // payout, and must not be the statement that blocks.
    const { api, first, answerPayout } = await sendWithPayoutHeld(key, body);

    const locker = new Client({ connectionString: testDatabaseUrl(), application_name: 'refunds-process-test-locker' });
    await locker.connect();
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE refunds IN ACCESS EXCLUSIVE MODE');
      const lockerPid = ((await locker.query('SELECT pg_backend_pid() AS pid')).rows[0] as { pid: number }).pid;
      answerPayout();

      // The provider answered, and the api is now in its commit transaction,
      // its INSERT of the row waiting on the test's lock.
      const blocked = await eventually(
        async () => {
          const rows = await ds.query<{ pid: number }[]>(
            `SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'api'
                AND wait_event_type = 'Lock' AND state = 'active' AND query LIKE '%INSERT INTO refunds%'
                AND $1 = ANY (pg_blocking_pids(pid))`,
            [lockerPid],
          );
          return rows[0]?.pid;
        },
        10_000,
        "the api's INSERT INTO refunds waiting on the test's lock",
      );
      expect(await recordOf(key)).toMatchObject({ state: 'running' });

      await kill(api);
      // The client saw the connection drop, never an answer.
      expect(((await first) as Error).message).toBe('fetch failed');
      await locker.query('ROLLBACK');
      // The dead process's backend gets the lock, finds its client gone and rolls back.
      await eventually(
        async () =>
          (await ds.query<unknown[]>(`SELECT 1 FROM pg_stat_activity WHERE pid = $1`, [blocked])).length === 0
            ? true
            : undefined,
        10_000,
        "the killed api's backend to end",
      );
    } finally {
      await locker.end();
    }
    // Paid, not recorded: the money left, the row and the answer did not commit.
    expect(fake.payoutsFor(refundId)).toHaveLength(1);
    expect(await rowsOf(refundId)).toEqual([]);
    expect(await recordOf(key)).toMatchObject({ state: 'running' });
    await expectMarkLeft(key, body);

    const restarted = await start();
    const { res } = await retryUntilAnswered(restarted, key, body);
    await expectRecordedOnce(restarted, key, body, res);
  }, 90_000);

  it('SIGKILL while the payout is still at the provider: the restarted api’s retry finds it by lookup; one payout, one row', async () => {
    const key = `refund-kill-inflight-${randomUUID()}`;
    const body = refundBody(randomUUID().slice(0, 8));
    const refundId = refundIdFor(operationOf(key));
    // Registered on arrival; the 201 is written only after the kill, to a connection that is gone.
    const { api, first, answerPayout } = await sendWithPayoutHeld(key, body);
    expect(await recordOf(key)).toMatchObject({ state: 'running' });

    await kill(api);
    expect(((await first) as Error).message).toBe('fetch failed');
    answerPayout();
    expect(await rowsOf(refundId)).toEqual([]);
    await expectMarkLeft(key, body);

    const restarted = await start();
    const { res } = await retryUntilAnswered(restarted, key, body);
    await expectRecordedOnce(restarted, key, body, res);
  }, 90_000);
});
