import { ApiClient, idempotencyKey, issueRefund, type Refund, refundKey, type RefundRequest } from '@app/client';
import { IdempotencyProblemTypes } from '@app/idempotency';
import { ProblemTypes } from '@app/problem';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { RefundProblemTypes, refundIdFor } from '../../apps/api/src/refunds/refunds.service';
import { createIssueRefundTool } from '../../libs/client/examples/issue-refund.tool';
import { type ApiHarness, bearer, startApi, TENANT_A, TENANT_B } from '../support/api-harness';
import { FakePaymentsServer, type FakePayout } from '../support/fake-payments-server';
import { eventually } from '../support/infra';
import { metricValue } from '../support/metrics';
import {
  ageAttempt,
  type AttemptRow,
  attemptRows,
  expireLock,
  forgetRecord,
  keyRecord,
  lookupsFor,
  paidAnswer,
  paidRow,
  payoutPostsFor,
  refundOperation,
  refundRows,
} from '../support/refunds';

/**
 * POST /v1/refunds and GET /v1/refunds/<id>, in-process, paying through the
 * production HttpPaymentsProvider against FakePaymentsServer: a provider that
 * never dedupes, so every paying POST is a payout and a double payment shows
 * as two payouts with one reference. Every case asserts the effects: the
 * payouts at the fake, the `refunds` rows, the key's record in
 * `idempotency_keys`, and (where a payout was sent and not recorded) the
 * refund's send mark in `refund_attempts`.
 *
 * PAYMENTS_TIMEOUT_S is 1, so no second payout is sent within 2 s of the
 * last one (the resend window): a retry inside it gets 503 outcome-unknown
 * and sends nothing. Tests end the window by moving the mark's last send an
 * hour back (ageAttempt); one waits it out for real.
 */

const PROBLEM_JSON = /^application\/problem\+json/;
const REFUSAL = { type: 'card-closed', title: 'Card closed', detail: 'the customer card ending 4242 was closed' };

const newKey = (): string => `refund-e2e-${randomUUID()}`;
const operation = (key: string, tenant: string = TENANT_A.tenant): string => refundOperation(tenant, key);
const refundIdOf = (key: string, tenant: string = TENANT_A.tenant): string => refundIdFor(operation(key, tenant));
const newBody = (over: Partial<RefundRequest> = {}): RefundRequest => ({
  ticket_id: `T-${randomUUID().slice(0, 8)}`,
  order_id: `ord_${randomUUID().slice(0, 8)}`,
  amount: 1250,
  currency: 'EUR',
  ...over,
});
/** The 201 a refund of `body` under `key` answers, paid with `payoutId`. */
const paidAnswerOf = (key: string, body: RefundRequest, payoutId: string): Refund =>
  paidAnswer(refundIdOf(key), body, payoutId);

describe('POST /v1/refunds against a payment provider over HTTP (FakePaymentsServer)', () => {
  let fake: FakePaymentsServer;
  let api: ApiHarness;
  let apiUrl: string;
  let db: DataSource;

  const post = (key: string | undefined, body: unknown, tenant: { key: string } = TENANT_A) => {
    let req = request(api.server).post('/v1/refunds').set('authorization', bearer(tenant));
    if (key !== undefined) req = req.set('idempotency-key', key);
    return req.send(body as object);
  };
  const rows = (refundId: string) => refundRows(db, refundId);
  const record = (key: string) => keyRecord(db, operation(key));
  const client = (over: Partial<ConstructorParameters<typeof ApiClient>[0]> = {}) =>
    new ApiClient({ baseUrl: apiUrl, apiKey: TENANT_A.key, backoff: { baseMs: 20, capMs: 100 }, ...over });

  /** The one payout of `key`'s refund at the fake, checked against the body it was asked with. */
  const onePayoutFor = (key: string, body: RefundRequest): FakePayout => {
    const refundId = refundIdOf(key);
    const payouts = fake.payoutsFor(refundId);
    expect(payouts).toHaveLength(1);
    expect(payouts[0]).toMatchObject({
      reference: refundId,
      idempotencyKey: refundId,
      order_id: body.order_id,
      amount: body.amount,
      currency: body.currency,
    });
    return payouts[0];
  };
  /** The one row of `key`'s refund, with that payout. */
  const oneRowFor = async (key: string, body: RefundRequest, payoutId: string): Promise<void> => {
    expect(await rows(refundIdOf(key))).toEqual([paidRow(refundIdOf(key), TENANT_A.tenant, body, payoutId)]);
  };
  /** The key's record: completed with the 201 it answered, stored whole. */
  const completedWith201 = async (key: string, answer: Refund): Promise<void> => {
    const rec = await record(key);
    expect(rec).toMatchObject({ state: 'completed', status: 201 });
    expect(JSON.parse(rec!.body!)).toEqual(answer);
  };
  /** The key's record as a request whose outcome is unknown leaves it: running, its lock ended. */
  const abandoned = async (key: string): Promise<void> => {
    expect(await record(key)).toMatchObject({ state: 'running', lock_expired: true });
  };
  const expectOutcomeUnknown = (res: request.Response): void => {
    expect(res.status).toBe(503);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body.type).toBe(IdempotencyProblemTypes.outcomeUnknown);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
  };
  const expectCreated = (res: request.Response, key: string, body: RefundRequest, payoutId: string): void => {
    expect(res.status).toBe(201);
    expect(res.body).toEqual(paidAnswerOf(key, body, payoutId));
    expect(res.headers.location).toBe(`/v1/refunds/${refundIdOf(key)}`);
  };
  /**
   * `res` is the 201 of `key`'s refund, paid once: one payout at the fake, one row with it, the key completed with
   * `res`'s answer, no send mark left.
   */
  const expectPaidOnce = async (res: request.Response, key: string, body: RefundRequest): Promise<FakePayout> => {
    const payout = onePayoutFor(key, body);
    expectCreated(res, key, body, payout.payout_id);
    await oneRowFor(key, body, payout.payout_id);
    await completedWith201(key, res.body);
    // Recorded: the send mark went in the same transaction.
    await noMarkFor(key);
    return payout;
  };
  /** `res` replays `answer`: the same 201, marked Idempotent-Replayed. */
  const expectReplay = (res: request.Response, answer: unknown): void => {
    expect(res.status).toBe(201);
    expect(res.headers['idempotent-replayed']).toBe('true');
    expect(res.body).toEqual(answer);
  };
  /**
   * `res` is a 503 outcome-unknown and nothing was paid: no payout, no row, the key abandoned, the send mark
   * standing.
   */
  const expectUnknownUnpaid = async (res: request.Response, key: string, body: RefundRequest): Promise<void> => {
    expectOutcomeUnknown(res);
    expect(fake.payouts).toHaveLength(0);
    expect(await rows(refundIdOf(key))).toHaveLength(0);
    await abandoned(key);
    await oneMarkFor(key, body);
  };
  /**
   * `res` is a 503 outcome-unknown though the payout was made: one payout, no row, the key abandoned, the send mark
   * standing.
   */
  const expectUnknownPaid = async (res: request.Response, key: string, body: RefundRequest): Promise<FakePayout> => {
    expectOutcomeUnknown(res);
    const payout = onePayoutFor(key, body);
    expect(await rows(refundIdOf(key))).toHaveLength(0);
    await abandoned(key);
    await oneMarkFor(key, body);
    return payout;
  };
  /** The send mark of `key`'s refund, one, with the facts of `body`. */
  const oneMarkFor = async (key: string, body: RefundRequest): Promise<AttemptRow> => {
    const marks = await attemptRows(db, refundIdOf(key));
    expect(marks).toEqual([
      {
        refund_id: refundIdOf(key),
        tenant: TENANT_A.tenant,
        ticket_id: body.ticket_id,
        order_id: body.order_id,
        amount: body.amount,
        currency: body.currency,
        sends: expect.any(Number),
        first_sent_at: expect.any(Date),
        last_sent_at: expect.any(Date),
      },
    ]);
    return marks[0];
  };
  const noMarkFor = async (key: string): Promise<void> => {
    expect(await attemptRows(db, refundIdOf(key))).toEqual([]);
  };
  /** The resend window of `key`'s refund is over (its last send moved an hour back). */
  const windowOver = (key: string) => ageAttempt(db, refundIdOf(key));
  /**
   * What is left of the resend window of `key`'s refund (2 × PAYMENTS_TIMEOUT_S from its last send), in ms by
   * PostgreSQL's clock, as the api reckons it: 0 once a send would be let through.
   */
  const windowLeftMs = async (key: string): Promise<number> => {
    const [row] = await db.query<{ left_ms: number }[]>(
      `SELECT GREATEST(0, ceil(extract(epoch FROM last_sent_at + interval '2 seconds' - now()) * 1000))::float8 AS left_ms
         FROM refund_attempts WHERE refund_id = $1`,
      [refundIdOf(key)],
    );
    if (!row) throw new Error(`no send mark for ${refundIdOf(key)}`);
    return row.left_ms;
  };
  /**
   * `res` is the 503 of a request inside the resend window: outcome-unknown, Retry-After at least 1 and at most
   * 2 × PAYMENTS_TIMEOUT_S.
   */
  const expectInsideWindow = (res: request.Response): number => {
    expectOutcomeUnknown(res);
    const retryAfter = Number(res.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(2);
    return retryAfter;
  };
  /**
   * The retries after a payout that settled nothing (and a lookup that found
   * nothing): one at once takes the key over, looks up (absent) and is held
   * off by the window (503, no second POST, the mark's sends still 1); once
   * the window is over, the next looks up again and pays, once.
   */
  const heldOffThenPaidOnce = async (key: string, body: RefundRequest): Promise<request.Response> => {
    const refundId = refundIdOf(key);
    const posts = payoutPostsFor(fake, refundId).length;
    const lookups = lookupsFor(fake, refundId).length;
    const early = await post(key, body);
    expectInsideWindow(early);
    await expectUnknownUnpaid(early, key, body);
    expect(payoutPostsFor(fake, refundId)).toHaveLength(posts);
    expect(lookupsFor(fake, refundId)).toHaveLength(lookups + 1);
    expect((await oneMarkFor(key, body)).sends).toBe(1);

    await windowOver(key);
    const retry = await post(key, body);
    await expectPaidOnce(retry, key, body);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    // The recovery's lookup (absent), then the payout with the same reference.
    expect(lookupsFor(fake, refundId)).toHaveLength(lookups + 2);
    const sent = { reference: refundId, order_id: body.order_id, amount: body.amount, currency: body.currency };
    expect(payoutPostsFor(fake, refundId).map((r) => r.body)).toEqual(Array.from({ length: posts + 1 }, () => sent));
    expect(fake.payoutsFor(refundId)).toHaveLength(1);
    return retry;
  };
  const refundMetrics = async () => ({
    paid: await metricValue(api.server, 'refunds_total', { outcome: 'paid' }),
    found: await metricValue(api.server, 'refunds_total', { outcome: 'found' }),
    refused: await metricValue(api.server, 'refunds_total', { outcome: 'refused' }),
    unknown: await metricValue(api.server, 'refunds_total', { outcome: 'unknown' }),
  });
  /** How far each refunds_total series moved since `before`. */
  const refundMetricsSince = async (before: Awaited<ReturnType<typeof refundMetrics>>) => {
    const now = await refundMetrics();
    return {
      paid: now.paid - before.paid,
      found: now.found - before.found,
      refused: now.refused - before.refused,
      unknown: now.unknown - before.unknown,
    };
  };

  beforeAll(async () => {
    fake = await new FakePaymentsServer().start();
    api = await startApi({ env: { PAYMENTS_URL: fake.url(), PAYMENTS_TIMEOUT_S: '1' } });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    db = api.app.get(DataSource);
  });
  afterAll(async () => {
    await api?.close();
    await fake?.stop();
  });
  beforeEach(() => {
    fake.reset();
    fake.defaultPayout = { kind: 'pay' };
    fake.defaultLookup = { kind: 'answer' };
  });

  describe('a new key', () => {
    it('pays once (reference = Idempotency-Key = refund_id), records one row with its answer, replays it, and GET reads it', async () => {
      const key = newKey();
      const body = newBody({ amount: 4321, currency: 'USD' });
      const refundId = refundIdOf(key);

      const first = await post(key, body);
      await expectPaidOnce(first, key, body);
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      expect(first.body.refund_id).toBe(refundId);
      // What the provider was sent, as it came.
      const [sent] = fake.payoutRequests();
      expect(sent.headers['idempotency-key']).toBe(refundId);
      expect(sent.headers['content-type']).toMatch(/^application\/json/);
      expect(sent.body).toEqual({
        reference: refundId,
        order_id: body.order_id,
        amount: body.amount,
        currency: body.currency,
      });
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(0);

      const replay = await post(key, body);
      expectReplay(replay, first.body);
      expect(replay.headers.location).toBe(first.headers.location);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      expect(await rows(refundId)).toHaveLength(1);

      const own = await request(api.server).get(first.headers.location).set('authorization', bearer(TENANT_A));
      expect(own.status).toBe(200);
      expect(own.body).toEqual({ ...first.body, created_at: expect.any(String) });
      expect(Number.isNaN(Date.parse(own.body.created_at))).toBe(false);
      const upper = await request(api.server)
        .get(`/v1/refunds/${refundId.toUpperCase()}`)
        .set('authorization', bearer(TENANT_A));
      expect(upper.status).toBe(200);
      expect(upper.body.refund_id).toBe(refundId);

      for (const [path, tenant] of [
        [first.headers.location, TENANT_B],
        [`/v1/refunds/${randomUUID()}`, TENANT_A],
        ['/v1/refunds/not-a-uuid', TENANT_A],
        [`/v1/refunds/${refundId}x`, TENANT_A],
      ] as const) {
        const res = await request(api.server).get(path).set('authorization', bearer(tenant));
        expect({ path, status: res.status }).toEqual({ path, status: 404 });
        expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
        expect(res.body.refund_id).toBeUndefined();
      }
      const anonymous = await request(api.server).get(first.headers.location);
      expect(anonymous.status).toBe(401);
    });
  });

  describe('a provider slower than PAYMENTS_TIMEOUT_S (it registers the payout on arrival, answers after 1.5 s)', () => {
    it('the api finds the payout by lookup (201); a retry while it runs gets 409, and after it the stored answer', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'pay', delayMs: 1500 });

      const first = post(key, body).then((r) => r);
      await fake.arrivals(1);
      const during = await post(key, body);
      expect(during.status).toBe(409);
      expect(during.body.type).toBe(IdempotencyProblemTypes.inProgress);
      expect(during.headers['retry-after']).toMatch(/^[1-9]\d*$/);

      const answer = await first;
      await expectPaidOnce(answer, key, body);
      // Timed out, then looked up: the one payout the slow answer would have given.
      expect(fake.lookupRequests()).toHaveLength(1);
      expect(fake.lookupRequests()[0].path).toBe(`/payouts?reference=${refundIdOf(key)}`);

      expectReplay(await post(key, body), answer.body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
    });

    it("an ApiClient whose attempts time out first: the client's retry gets the refund, paid once", async () => {
      const body = newBody();
      const key = refundKey(body);
      fake.nextPayouts({ kind: 'pay', delayMs: 1500 });

      // Each attempt gives up after 300 ms, well before the api's own 1 s
      // timeout and lookup: the first attempt's answer is lost to the client.
      const result = await issueRefund(client({ attemptTimeoutMs: 300, deadlineMs: 10_000 }), body);
      const payout = onePayoutFor(key, body);
      expect(result).toMatchObject({
        outcome: 'succeeded',
        status: 201,
        replayed: true,
        location: `/v1/refunds/${refundIdOf(key)}`,
      });
      expect(result.attempts).toBeGreaterThanOrEqual(2);
      expect(result.outcome === 'succeeded' && result.body).toEqual(paidAnswerOf(key, body, payout.payout_id));
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      await oneRowFor(key, body, payout.payout_id);
      await completedWith201(key, paidAnswerOf(key, body, payout.payout_id));
    });
  });

  describe('a payout whose outcome is unknown', () => {
    it('dropped before paying: 503 (Retry-After 2 × PAYMENTS_TIMEOUT_S), nothing paid, key abandoned; a retry at once sends nothing (503); after the window the retry looks up, pays once, 201', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'drop' });

      const first = await post(key, body);
      await expectUnknownUnpaid(first, key, body);
      expect(first.headers['retry-after']).toBe('2');
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);
      expect((await oneMarkFor(key, body)).sends).toBe(1);

      // At once: the takeover's recovery looks up (absent), and the send is
      // refused: the dropped request may still be settling at a real provider.
      const early = await post(key, body);
      expectInsideWindow(early);
      await expectUnknownUnpaid(early, key, body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(2);
      expect((await oneMarkFor(key, body)).sends).toBe(1);

      await windowOver(key);
      const retry = await post(key, body);
      await expectPaidOnce(retry, key, body);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      // The recovery's lookup (absent), then the payout with the same reference.
      expect(fake.lookupRequests()).toHaveLength(3);
      expect(fake.payoutRequests()).toHaveLength(2);
      expect(fake.payouts).toHaveLength(1);

      expectReplay(await post(key, body), retry.body);
      expect(fake.payoutRequests()).toHaveLength(2);
      expect(fake.payouts).toHaveLength(1);
    });

    it('a provider that never answers: 503 with Retry-After = 2 × PAYMENTS_TIMEOUT_S, nothing paid; a retry at once is held off (503, no payout); waiting out its Retry-After, the retry pays once', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'hang' });

      const first = await post(key, body);
      await expectUnknownUnpaid(first, key, body);
      expect(first.headers['retry-after']).toBe('2');
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);

      // The hanging payout went out about PAYMENTS_TIMEOUT_S ago: the window has about 1 s left.
      const early = await post(key, body);
      const retryAfter = expectInsideWindow(early);
      await expectUnknownUnpaid(early, key, body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(2);
      const mark = await oneMarkFor(key, body);
      expect(mark.sends).toBe(1);

      // Retry-After covers what is left of the window (rounded up); the real wait, once in the suite, is for the
      // window itself to end in the database, not for a time.
      expect(await windowLeftMs(key)).toBeLessThanOrEqual(retryAfter * 1000);
      await eventually(
        async () => ((await windowLeftMs(key)) === 0 ? true : undefined),
        5000,
        'the resend window to end',
      );
      const retry = await post(key, body);
      await expectPaidOnce(retry, key, body);
      expect(fake.payoutRequests()).toHaveLength(2);
      expect(fake.lookupRequests()).toHaveLength(3);
      expect(fake.payouts).toHaveLength(1);
    });

    it.each([
      ['pay-then-drop', { kind: 'pay-then-drop' } as const],
      ['fail 500 after paying', { kind: 'fail', status: 500, pay: true } as const],
      ['fail 429 after paying', { kind: 'fail', status: 429, pay: true } as const],
    ])('%s: the lookup at once finds the payout, 201 on the first request, one payout', async (_name, behaviour) => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts(behaviour);

      const first = await post(key, body);
      await expectPaidOnce(first, key, body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);

      expectReplay(await post(key, body), first.body);
      expect(fake.payouts).toHaveLength(1);
    });

    it('fail 500 without paying: the lookup finds nothing, 503 (Retry-After 2); a retry at once sends nothing (503); after the window the retry pays once', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'fail', status: 500 });

      const first = await post(key, body);
      await expectUnknownUnpaid(first, key, body);
      expect(first.headers['retry-after']).toBe('2');
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);

      await heldOffThenPaidOnce(key, body);
      expect(fake.payoutRequests()).toHaveLength(2);
      expect(fake.lookupRequests()).toHaveLength(3);
    });
  });

  describe('the lookup failing too', () => {
    it('payout dropped unpaid, lookup failing: 503; with the provider healthy a retry at once looks up (absent) but sends nothing (503); after the window the retry pays once', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'drop' });
      fake.nextLookups({ kind: 'fail', status: 503 });

      await expectUnknownUnpaid(await post(key, body), key, body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);

      await heldOffThenPaidOnce(key, body);
      expect(fake.lookupRequests()).toHaveLength(3);
      expect(fake.payoutRequests()).toHaveLength(2);
      expect(fake.payouts).toHaveLength(1);
    });

    it('paid then dropped, lookup failing: 503; the retry recovers the payout by lookup and pays nothing more', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'pay-then-drop' });
      fake.nextLookups({ kind: 'drop' });

      const payout = await expectUnknownPaid(await post(key, body), key, body);

      // Still unknown on the next try: the recovery's lookup fails too, and nothing is paid.
      fake.nextLookups({ kind: 'fail', status: 502 });
      expect(await expectUnknownPaid(await post(key, body), key, body)).toEqual(payout);
      expect(fake.payoutRequests()).toHaveLength(1);

      expect((await expectPaidOnce(await post(key, body), key, body)).payout_id).toBe(payout.payout_id);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(3);
    });
  });

  describe('the send mark (refund_attempts) and the resend window (2 × PAYMENTS_TIMEOUT_S = 2 s)', () => {
    it('a retry inside the window: 503 outcome-unknown, Retry-After 1..2, no second POST /payouts; the mark shows one send', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'drop' });
      await expectUnknownUnpaid(await post(key, body), key, body);
      const mark = await oneMarkFor(key, body);
      expect(mark.sends).toBe(1);
      expect(mark.last_sent_at).toEqual(mark.first_sent_at);

      for (let i = 0; i < 2; i++) {
        const early = await post(key, body);
        expectInsideWindow(early);
        await expectUnknownUnpaid(early, key, body);
      }
      // Each retry took the key over and looked up first; none was let send.
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(3);
      expect(await oneMarkFor(key, body)).toEqual(mark);
      expect(await rows(refundIdOf(key))).toEqual([]);
    });

    it('two requests racing for one refund (B takes the key over while A’s payout is still at the provider): B’s lookup finds nothing and its send is refused (503); one payout POST', async () => {
      const key = newKey();
      const body = newBody();
      const refundId = refundIdOf(key);
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      // Held: registers nothing, answers the default refusal once released.
      fake.nextPayouts({ kind: 'gate', pay: false, gate });

      const a = post(key, body).then((r) => r);
      await fake.arrivals(1);
      expect(await record(key)).toMatchObject({ state: 'running', lock_expired: false });
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      // A's lock ends while it still runs (as if its renewals had failed for a whole TTL).
      await expireLock(db, operation(key));

      const b = await post(key, body);
      expectInsideWindow(b);
      expect(payoutPostsFor(fake, refundId)).toHaveLength(1);
      // B's recovery asked the provider (absent: A's payout is not settled); its handler did not ask again.
      expect(lookupsFor(fake, refundId)).toHaveLength(1);
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      expect(await rows(refundId)).toEqual([]);
      await abandoned(key);

      release();
      const aRes = await a;
      // A's payout was refused (422, not stored: the key is B's now), or its own timeout came first (503).
      expect({ status: aRes.status, fine: aRes.status < 500 || aRes.status === 503 }).toEqual({
        status: aRes.status,
        fine: true,
      });
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(0);
      expect(await rows(refundId)).toEqual([]);
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      await abandoned(key);

      // With the window over, the key's next request looks up (absent) and pays, once.
      await windowOver(key);
      const retry = await post(key, body);
      await expectPaidOnce(retry, key, body);
      expect(payoutPostsFor(fake, refundId)).toHaveLength(2);
      expect(lookupsFor(fake, refundId)).toHaveLength(aRes.status === 503 ? 3 : 2);
    });

    it('a success records the refund and removes its mark; a refusal removes it too (stored with it), and its replay sends nothing', async () => {
      const paidKey = newKey();
      const paidBody = newBody();
      await expectPaidOnce(await post(paidKey, paidBody), paidKey, paidBody);
      expect(await attemptRows(db, refundIdOf(paidKey))).toEqual([]);

      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'refuse' });
      const refused = await post(key, body);
      expect(refused.status).toBe(422);
      expect(refused.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(refused.headers.location).toBeUndefined();
      expect(refused.body.type).toBe(RefundProblemTypes.paymentRefused);
      expect(await rows(refundIdOf(key))).toEqual([]);
      const rec = await record(key);
      expect(rec).toMatchObject({ state: 'completed', status: 422 });
      expect(JSON.parse(rec!.body!)).toEqual(refused.body);
      expect(await attemptRows(db, refundIdOf(key))).toEqual([]);

      const replay = await post(key, body);
      expect(replay.status).toBe(422);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(replay.body).toEqual(refused.body);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(0);
      expect(fake.payouts.filter((p) => p.reference === refundIdOf(key))).toEqual([]);
      expect(await attemptRows(db, refundIdOf(key))).toEqual([]);

      // Its record swept, the key pays afresh: no mark, so no lookup first.
      await forgetRecord(db, operation(key));
      await expectPaidOnce(await post(key, body), key, body);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(2);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(0);
      expect(await attemptRows(db, refundIdOf(key))).toEqual([]);
    });

    it('a refusal of a resend (the first send dropped, looked up absent) removes the mark of both sends', async () => {
      const key = newKey();
      const body = newBody();
      fake.nextPayouts({ kind: 'drop' });
      await expectUnknownUnpaid(await post(key, body), key, body);

      await windowOver(key);
      fake.nextPayouts({ kind: 'refuse', status: 422, body: REFUSAL });
      const refused = await post(key, body);
      expect(refused.status).toBe(422);
      expect(refused.body.type).toBe(RefundProblemTypes.paymentRefused);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(2);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(2);
      expect(fake.payouts).toHaveLength(0);
      expect(await record(key)).toMatchObject({ state: 'completed', status: 422 });
      expect(await attemptRows(db, refundIdOf(key))).toEqual([]);
      expect(await rows(refundIdOf(key))).toEqual([]);
    });

    it('a refusal of a send a later send superseded (the mark moved on): not stored, 503, the key abandoned, the mark of the later send standing', async () => {
      const key = newKey();
      const body = newBody();
      const refundId = refundIdOf(key);
      let refuse!: () => void;
      fake.nextPayouts({ kind: 'gate', pay: false, gate: new Promise<void>((r) => (refuse = r)) });
      const pending = post(key, body).then((r) => r);
      await fake.arrivals(1);
      // Another send of the refund left while this one was held (a takeover once the window passed): its outcome is
      // nobody's yet, so the refusal of the first must not settle the refund.
      await db.query(`UPDATE refund_attempts SET sends = sends + 1, last_sent_at = now() WHERE refund_id = $1`, [
        refundId,
      ]);
      refuse();
      const res = await pending;

      expectOutcomeUnknown(res);
      expect(res.body.detail).toMatch(/another payout/i);
      await abandoned(key);
      expect((await oneMarkFor(key, body)).sends).toBe(2);
      expect(await rows(refundId)).toEqual([]);
      expect(payoutPostsFor(fake, refundId)).toHaveLength(1);
    });

    it('a key whose request died before sending anything (a dead record, no mark): the takeover pays with no lookup, once', async () => {
      const body = newBody();
      // The fingerprint the api gives this body (it depends on the body only): from a completed record of it under
      // another key.
      const donor = newKey();
      await expectPaidOnce(await post(donor, body), donor, body);
      const [{ fingerprint }] = await db.query<{ fingerprint: string }[]>(
        `SELECT fingerprint FROM idempotency_keys WHERE key = $1`,
        [operation(donor)],
      );

      const key = newKey();
      const refundId = refundIdOf(key);
      await db.query(
        `INSERT INTO idempotency_keys (key, fingerprint, state, token, attempt, started_at, locked_until, expires_at)
         VALUES ($1, $2, 'running', 'dead', $3, now() - interval '1 minute', now() - interval '1 second', now() + interval '1 day')`,
        [operation(key), fingerprint, randomUUID()],
      );
      await abandoned(key);
      expect(await attemptRows(db, refundId)).toEqual([]);

      const res = await post(key, body);
      await expectPaidOnce(res, key, body);
      expect(res.headers['idempotent-replayed']).toBeUndefined();
      // No mark: nothing was ever sent, so nothing is asked before paying.
      expect(lookupsFor(fake, refundId)).toHaveLength(0);
      expect(payoutPostsFor(fake, refundId)).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(0);
      expect(fake.payoutRequests()).toHaveLength(2);
    });
  });

  it('20 concurrent requests with one key while the payout is held: one payout, one row, the others 409 (or replays); every retry gets the 201', async () => {
    const key = newKey();
    const body = newBody();
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    fake.nextPayouts({ kind: 'gate', gate });

    let settled = 0;
    const all = Array.from({ length: 20 }, () =>
      post(key, body).then((res) => {
        settled++;
        return res;
      }),
    );
    await fake.arrivals(1);
    // Every duplicate has had its answer while the payout is held (or the api's
    // own timeout settled it by lookup first: then the late ones are replays).
    await eventually(() => (settled >= 19 ? true : undefined), 10_000, '19 duplicates answered');
    open();
    const answers = await Promise.all(all);

    const created = answers.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
    expect(created).toHaveLength(1);
    await expectPaidOnce(created[0], key, body);
    expect(fake.payoutRequests()).toHaveLength(1);
    for (const other of answers.filter((r) => r !== created[0])) {
      if (other.status === 409) {
        expect(other.body.type).toBe(IdempotencyProblemTypes.inProgress);
        expect(other.headers['retry-after']).toMatch(/^[1-9]\d*$/);
      } else {
        expectReplay(other, created[0].body);
      }
    }

    const retries = await Promise.all(Array.from({ length: 19 }, () => post(key, body).then((r) => r)));
    for (const retry of retries) expectReplay(retry, created[0].body);
    expect(fake.payoutRequests()).toHaveLength(1);
    expect(fake.payouts).toHaveLength(1);
    expect(await rows(refundIdOf(key))).toHaveLength(1);
  });

  it('two refunds of one order from two tickets: two keys, two payouts, two rows, two refund ids', async () => {
    const order = `ord_${randomUUID().slice(0, 8)}`;
    const one = newBody({ ticket_id: `T-${randomUUID().slice(0, 8)}`, order_id: order, amount: 500 });
    const two = newBody({ ticket_id: `T-${randomUUID().slice(0, 8)}`, order_id: order, amount: 500 });
    const keyOne = refundKey(one);
    const keyTwo = refundKey(two);
    expect(keyOne).toBe(idempotencyKey('refund', one.ticket_id, order));
    expect(keyOne).not.toBe(keyTwo);

    const first = await post(keyOne, one);
    const second = await post(keyTwo, two);
    const payoutOne = await expectPaidOnce(first, keyOne, one);
    const payoutTwo = await expectPaidOnce(second, keyTwo, two);
    expect(first.body.refund_id).not.toBe(second.body.refund_id);
    expect(payoutOne.payout_id).not.toBe(payoutTwo.payout_id);
    expect(fake.payouts).toHaveLength(2);
    expect(Number((await db.query(`SELECT count(*) AS n FROM refunds WHERE order_id = $1`, [order]))[0].n)).toBe(2);
  });

  it('the same key with another amount: 422 idempotency-key-reused, no second payout, the row unchanged', async () => {
    const key = newKey();
    const body = newBody();
    const first = await post(key, body);
    const payout = await expectPaidOnce(first, key, body);

    const other = await post(key, { ...body, amount: body.amount + 1 });
    expect(other.status).toBe(422);
    expect(other.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(other.body.type).toBe(IdempotencyProblemTypes.keyReused);
    expect(fake.payoutRequests()).toHaveLength(1);
    expect(fake.lookupRequests()).toHaveLength(0);
    await oneRowFor(key, body, payout.payout_id);
    await completedWith201(key, first.body);
  });

  it("a refusal: 422 payment-refused naming the provider's reason, stored and replayed without a second call, no row", async () => {
    const key = newKey();
    const body = newBody();
    fake.nextPayouts({ kind: 'refuse', status: 422, body: REFUSAL });

    const first = await post(key, body);
    expect(first.status).toBe(422);
    expect(first.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(first.body.type).toBe(RefundProblemTypes.paymentRefused);
    expect(first.body.detail).toContain(REFUSAL.detail);
    expect(first.body.refund_id).toBe(refundIdOf(key));
    expect(first.body.provider_status).toBe(422);
    expect(fake.payoutRequests()).toHaveLength(1);
    expect(fake.lookupRequests()).toHaveLength(0);
    expect(fake.payouts).toHaveLength(0);
    expect(await rows(refundIdOf(key))).toHaveLength(0);
    const rec = await record(key);
    expect(rec).toMatchObject({ state: 'completed', status: 422 });
    expect(JSON.parse(rec!.body!)).toEqual(first.body);

    const replay = await post(key, body);
    expect(replay.status).toBe(422);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(replay.body).toEqual(first.body);
    expect(fake.payoutRequests()).toHaveLength(1);
    expect(fake.payouts).toHaveLength(0);
    expect(await rows(refundIdOf(key))).toHaveLength(0);
  });

  it('an agent turn re-run: the example tool called twice (fresh clients) pays once, and both replies name the same refund', async () => {
    const ticketId = `T-${randomUUID().slice(0, 8)}`;
    const orderId = `ord_${randomUUID().slice(0, 8)}`;
    const body: RefundRequest = { ticket_id: ticketId, order_id: orderId, amount: 2599, currency: 'EUR' };
    const key = refundKey(body);

    const turn = () => createIssueRefundTool(client(), { currency: 'EUR' })(ticketId, orderId, 2599);
    const first = await turn();
    const second = await turn();

    const payout = onePayoutFor(key, body);
    expect(first).toMatchObject({ status: 'refunded', refund_id: refundIdOf(key), payout_id: payout.payout_id });
    expect(second).toMatchObject({ status: 'refunded', refund_id: refundIdOf(key), payout_id: payout.payout_id });
    expect(fake.payoutRequests()).toHaveLength(1);
    expect(fake.payouts).toHaveLength(1);
    await oneRowFor(key, body, payout.payout_id);
    await completedWith201(key, paidAnswerOf(key, body, payout.payout_id));
  });

  describe('a refund whose record expired (the idempotency_keys row is gone, the refunds row stays)', () => {
    const forget = (key: string) => db.query(`DELETE FROM idempotency_keys WHERE key = $1`, [operation(key)]);

    it('the same key and body: 201 from the row, no new payout; another amount: 422, no payout', async () => {
      const key = newKey();
      const body = newBody();
      const first = await post(key, body);
      const payout = await expectPaidOnce(first, key, body);

      await forget(key);
      expect(await record(key)).toBeUndefined();
      const again = await post(key, body);
      await expectPaidOnce(again, key, body);
      expect(again.body).toEqual(first.body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(0);

      await forget(key);
      const other = await post(key, { ...body, amount: body.amount + 100 });
      expect(other.status).toBe(422);
      expect(other.body.type).toBe(IdempotencyProblemTypes.keyReused);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      await oneRowFor(key, body, payout.payout_id);
    });

    it('after another body was refused under the key, the original body still gets its refund (201 from the row)', async () => {
      const key = newKey();
      const body = newBody();
      const first = await post(key, body);
      const payout = await expectPaidOnce(first, key, body);

      await forget(key);
      const other = await post(key, { ...body, amount: body.amount + 100 });
      expect(other.status).toBe(422);
      expect(other.body.type).toBe(IdempotencyProblemTypes.keyReused);

      // The refund under this key is the original body's: its retry must be
      // answered with it, not told that the key was used with another body.
      const original = await post(key, body);
      expect({ status: original.status, type: original.body.type }).toEqual({ status: 201, type: undefined });
      expect(original.body).toEqual(first.body);
      expect(fake.payoutRequests()).toHaveLength(1);
      await oneRowFor(key, body, payout.payout_id);
    });
  });

  describe('the commit failing after the payout (paid, never recorded)', () => {
    const TRIGGER = 'refunds_e2e_fail_commit';
    afterEach(async () => {
      await db.query(`DROP TRIGGER IF EXISTS ${TRIGGER} ON refunds`);
      await db.query(`DROP FUNCTION IF EXISTS ${TRIGGER}()`);
    });
    /** A body whose refunds row cannot be inserted until letCommit(): only this test's ticket fails. */
    const failingCommitBody = async (): Promise<RefundRequest> => {
      const body = newBody({ ticket_id: `T-fail-${randomUUID().slice(0, 8)}` });
      // The literal is made of [A-Za-z0-9-].
      expect(body.ticket_id).toMatch(/^[A-Za-z0-9-]+$/);
      await db.query(`CREATE OR REPLACE FUNCTION ${TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refunds e2e: the commit fails'; END $$`);
      await db.query(
        `CREATE TRIGGER ${TRIGGER} BEFORE INSERT ON refunds FOR EACH ROW WHEN (NEW.ticket_id = '${body.ticket_id}') EXECUTE FUNCTION ${TRIGGER}()`,
      );
      return body;
    };
    const letCommit = () => db.query(`DROP TRIGGER ${TRIGGER} ON refunds`);
    /**
     * The first request pays and cannot record it: 503, one payout, no row, the key abandoned, the mark standing
     * (sends 1); no lookup yet.
     */
    const paidNotRecorded = async (key: string, body: RefundRequest): Promise<FakePayout> => {
      const before = await refundMetrics();
      const payout = await expectUnknownPaid(await post(key, body), key, body);
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(0);
      // Paid at the provider, not recorded: unknown, never paid.
      expect(await refundMetricsSince(before)).toEqual({ paid: 0, found: 0, refused: 0, unknown: 1 });
      return payout;
    };

    it('503 outcome-unknown, one payout, no row; once the database takes it, the retry records that payout (201), still one payout', async () => {
      const key = newKey();
      const body = await failingCommitBody();
      const payout = await paidNotRecorded(key, body);

      await letCommit();
      const before = await refundMetrics();
      expect((await expectPaidOnce(await post(key, body), key, body)).payout_id).toBe(payout.payout_id);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      // Settled by the recovery's lookup.
      expect(await refundMetricsSince(before)).toEqual({ paid: 0, found: 1, refused: 0, unknown: 0 });
    });

    it("and the key's record swept (a day later): the same key and body, a fresh claim, looks the payout up through the mark and records it (201 with its payout_id); one payout, one row, the mark gone", async () => {
      const key = newKey();
      const body = await failingCommitBody();
      const payout = await paidNotRecorded(key, body);
      await letCommit();
      // The dead request's record expired and was swept: nothing in idempotency_keys says the key was used.
      await forgetRecord(db, operation(key));
      expect(await record(key)).toBeUndefined();

      const before = await refundMetrics();
      const late = await post(key, body);
      expect(late.headers['idempotent-replayed']).toBeUndefined();
      expect((await expectPaidOnce(late, key, body)).payout_id).toBe(payout.payout_id);
      expect(late.body.payout_id).toBe(payout.payout_id);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(fake.payouts).toHaveLength(1);
      expect(await refundMetricsSince(before)).toEqual({ paid: 0, found: 1, refused: 0, unknown: 0 });

      expectReplay(await post(key, body), late.body);
      expect(fake.payoutRequests()).toHaveLength(1);
      expect(fake.lookupRequests()).toHaveLength(1);
    });

    it("and the key's record swept: the same key with ANOTHER amount is 422 key-reused, sends and records nothing, and leaves the key to its own body", async () => {
      const key = newKey();
      const body = await failingCommitBody();
      const payout = await paidNotRecorded(key, body);
      await letCommit();
      await forgetRecord(db, operation(key));
      const mark = await oneMarkFor(key, body);

      const other = await post(key, { ...body, amount: body.amount + 500 });
      expect(other.status).toBe(422);
      expect(other.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(other.body.type).toBe(IdempotencyProblemTypes.keyReused);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(0);
      expect(fake.payouts).toHaveLength(1);
      expect(await rows(refundIdOf(key))).toEqual([]);
      // The mismatch is not stored (the key's own body must still get its refund), and the mark is the first body's,
      // as it was.
      expect(await record(key)).toBeUndefined();
      expect(await oneMarkFor(key, body)).toEqual(mark);

      const own = await post(key, body);
      expect((await expectPaidOnce(own, key, body)).payout_id).toBe(payout.payout_id);
      expect(payoutPostsFor(fake, refundIdOf(key))).toHaveLength(1);
      expect(lookupsFor(fake, refundIdOf(key))).toHaveLength(1);
    });
  });

  describe('an abandoned key retried with another body', () => {
    it('paid then dropped, lookup failing, then the key with another amount: 422, and no row records a payout with an amount it did not pay', async () => {
      const key = newKey();
      const body = newBody({ amount: 1250 });
      fake.nextPayouts({ kind: 'pay-then-drop' });
      fake.nextLookups({ kind: 'fail' });

      const payout = await expectUnknownPaid(await post(key, body), key, body);

      const other = await post(key, { ...body, amount: 99_999 });
      // The key's operation is the 1250 refund, and it was paid: another body
      // under the key is a reuse (422), and whatever is recorded must be what was paid.
      expect({
        status: other.status,
        type: other.body.type,
        payouts: fake.payouts.map((p) => p.amount),
        rows: (await rows(refundIdOf(key))).map((r) => ({ amount: r.amount, payout_id: r.payout_id })),
      }).toEqual({
        status: 422,
        type: IdempotencyProblemTypes.keyReused,
        payouts: [1250],
        rows: [],
      });
      expect(fake.payoutRequests()).toHaveLength(1);
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      // With the key's own body, the retry records the payout that was made.
      expect((await expectPaidOnce(await post(key, body), key, body)).payout_id).toBe(payout.payout_id);
      expect(fake.payouts).toHaveLength(1);
    });

    it('dropped unpaid, then the key with another amount: 422, nothing paid for the other body', async () => {
      const key = newKey();
      const body = newBody({ amount: 1250 });
      fake.nextPayouts({ kind: 'drop' });

      await expectUnknownUnpaid(await post(key, body), key, body);

      // The first payout's outcome was unknown (at a real provider it may still
      // land): paying another amount under the same reference could pay both.
      const other = await post(key, { ...body, amount: 99_999 });
      expect({
        status: other.status,
        type: other.body.type,
        payouts: fake.payouts.map((p) => p.amount),
        rows: (await rows(refundIdOf(key))).map((r) => r.amount),
      }).toEqual({ status: 422, type: IdempotencyProblemTypes.keyReused, payouts: [], rows: [] });
      expect(fake.payoutRequests()).toHaveLength(1);
      // The mark is the first body's, and the key still its abandoned request's.
      expect((await oneMarkFor(key, body)).sends).toBe(1);
      await abandoned(key);
    });
  });

  describe('bad input leaves nothing behind', () => {
    const cases: [string, Record<string, unknown>, string][] = [
      ['amount as a string', { amount: '1250' }, 'amount'],
      ['amount 0', { amount: 0 }, 'amount'],
      ['amount 1.5', { amount: 1.5 }, 'amount'],
      ['amount 1000000001', { amount: 1_000_000_001 }, 'amount'],
      ['amount null', { amount: null }, 'amount'],
      ['amount -5', { amount: -5 }, 'amount'],
      ['amount 1e21', { amount: 1e21 }, 'amount'],
      ["currency 'eur'", { currency: 'eur' }, 'currency'],
      ["currency 'EURO'", { currency: 'EURO' }, 'currency'],
      ["ticket_id ''", { ticket_id: '' }, 'ticket_id'],
      ['ticket_id of 65 characters', { ticket_id: 'T'.repeat(65) }, 'ticket_id'],
      ['ticket_id an object', { ticket_id: { id: 'T-1' } }, 'ticket_id'],
      ['an unknown field', { refund_twice: true }, 'refund_twice'],
      ['order_id with a NUL character', { order_id: 'ord_\u00001' }, 'order_id'],
      ['order_id missing', { order_id: undefined }, 'order_id'],
    ];

    it.each(cases)('%s: 400 naming the field; no payout, no row, no record', async (_name, over, field) => {
      const key = newKey();
      const body = { ...newBody(), ...over };
      const res = await post(key, body);
      expect(res.status).toBe(400);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body.type).toBe(ProblemTypes.validationFailed);
      expect((res.body.errors as { field: string }[]).map((e) => e.field)).toContain(field);
      expect(res.body.detail).toContain(field);
      expect(fake.requests).toHaveLength(0);
      expect(await rows(refundIdOf(key))).toHaveLength(0);
      expect(await record(key)).toBeUndefined();
      // Corrected, the same key runs for real.
      const fixed = newBody();
      await expectPaidOnce(await post(key, fixed), key, fixed);
    });

    it.each([
      ['amount "1250"', { amount: '1250' }, 'amount: amount must be an integer number'],
      ['amount null', { amount: null }, 'amount: amount must be an integer number'],
      ['amount 1.5', { amount: 1.5 }, 'amount: amount must be an integer number'],
      ['amount 0', { amount: 0 }, 'amount: amount must not be less than 1'],
      ['a ticket_id object', { ticket_id: { id: 'T-1' } }, 'ticket_id: ticket_id must be a string'],
    ])(
      '%s: the detail says what is wrong, a type error as a type error (not the range it fails too); nothing left behind',
      async (_name, over, detail) => {
        const key = newKey();
        const res = await post(key, { ...newBody(), ...over });
        expect({ status: res.status, type: res.body.type, detail: res.body.detail }).toEqual({
          status: 400,
          type: ProblemTypes.validationFailed,
          detail,
        });
        expect(fake.requests).toHaveLength(0);
        expect(await rows(refundIdOf(key))).toHaveLength(0);
        expect(await record(key)).toBeUndefined();
      },
    );

    it('missing or malformed Idempotency-Key: 400 naming the header; no payout, no row, no record', async () => {
      const recordsBefore = Number((await db.query(`SELECT count(*) AS n FROM idempotency_keys`))[0].n);
      const refundsBefore = Number((await db.query(`SELECT count(*) AS n FROM refunds`))[0].n);

      const missing = await post(undefined, newBody());
      expect(missing.status).toBe(400);
      expect(missing.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(missing.body.type).toBe(IdempotencyProblemTypes.keyMissing);
      expect(`${missing.body.title} ${missing.body.detail}`).toContain('Idempotency-Key');

      for (const bad of ['too-short', 'has a space in it here', 'has,a,comma,in,it,here']) {
        const res = await post(bad, newBody());
        expect({ bad, status: res.status }).toEqual({ bad, status: 400 });
        expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
        expect(res.body.type).toBe(IdempotencyProblemTypes.keyInvalid);
        expect(res.body.title).toContain('Idempotency-Key');
        expect(await record(bad)).toBeUndefined();
      }

      expect(fake.requests).toHaveLength(0);
      expect(Number((await db.query(`SELECT count(*) AS n FROM idempotency_keys`))[0].n)).toBe(recordsBefore);
      expect(Number((await db.query(`SELECT count(*) AS n FROM refunds`))[0].n)).toBe(refundsBefore);
    });

    it('bodies that are not a refund at all are 4xx, never 5xx, and leave nothing behind', async () => {
      const raw = (key: string, text: string, contentType = 'application/json') =>
        request(api.server)
          .post('/v1/refunds')
          .set('authorization', bearer(TENANT_A))
          .set('idempotency-key', key)
          .set('content-type', contentType)
          .send(text);
      const bodies: [string, string, string?][] = [
        ['not JSON', '{"ticket_id": '],
        ['an array', '[{"ticket_id":"T-1","order_id":"o","amount":1,"currency":"EUR"}]'],
        ['null', 'null'],
        ['a number', '1250'],
        ['empty', ''],
        ['__proto__ field', '{"ticket_id":"T-1","order_id":"o","amount":1,"currency":"EUR","__proto__":{"x":1}}'],
        ['amount 1e400', '{"ticket_id":"T-1","order_id":"o","amount":1e400,"currency":"EUR"}'],
        ['duplicate members', '{"ticket_id":"T-1","order_id":"o","amount":1,"amount":"1","currency":"EUR"}'],
        ['form-encoded', 'ticket_id=T-1&order_id=o&amount=1&currency=EUR', 'application/x-www-form-urlencoded'],
        ['text', 'refund please', 'text/plain'],
      ];
      for (const [name, text, contentType] of bodies) {
        const key = newKey();
        const res = await raw(key, text, contentType);
        expect({ name, status: res.status, fourXX: res.status >= 400 && res.status < 500 }).toEqual({
          name,
          status: res.status,
          fourXX: true,
        });
        expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
        expect(await rows(refundIdOf(key))).toHaveLength(0);
        expect(await record(key)).toBeUndefined();
      }
      expect(fake.requests).toHaveLength(0);
    });
  });

  it('metrics: refunds_total counts each request by its outcome, refund_provider_calls_total each answer of the provider', async () => {
    const sample = async () => ({
      ...(await refundMetrics()),
      payoutPaid: await metricValue(api.server, 'refund_provider_calls_total', { call: 'payout', result: 'paid' }),
      payoutRefused: await metricValue(api.server, 'refund_provider_calls_total', {
        call: 'payout',
        result: 'refused',
      }),
      payoutUnknown: await metricValue(api.server, 'refund_provider_calls_total', {
        call: 'payout',
        result: 'unknown',
      }),
      lookupFound: await metricValue(api.server, 'refund_provider_calls_total', { call: 'lookup', result: 'found' }),
      lookupAbsent: await metricValue(api.server, 'refund_provider_calls_total', { call: 'lookup', result: 'absent' }),
      lookupUnknown: await metricValue(api.server, 'refund_provider_calls_total', {
        call: 'lookup',
        result: 'unknown',
      }),
    });
    const before = await sample();

    const paidKey = newKey();
    const paidBody = newBody();
    expect((await post(paidKey, paidBody)).status).toBe(201); // paid: payout paid
    expect((await post(paidKey, paidBody)).status).toBe(201); // replay: nothing
    fake.nextPayouts({ kind: 'pay-then-drop' });
    expect((await post(newKey(), newBody())).status).toBe(201); // found: payout unknown, lookup found
    fake.nextPayouts({ kind: 'refuse' });
    expect((await post(newKey(), newBody())).status).toBe(422); // refused: payout refused
    const unknownKey = newKey();
    const unknownBody = newBody();
    fake.nextPayouts({ kind: 'drop' });
    expect((await post(unknownKey, unknownBody)).status).toBe(503); // unknown: payout unknown, lookup absent
    fake.nextLookups({ kind: 'fail' });
    expect((await post(unknownKey, unknownBody)).status).toBe(503); // unknown: the recovery's lookup unknown
    // unknown: the recovery's lookup absent, the send inside the window
    expect((await post(unknownKey, unknownBody)).status).toBe(503);
    await windowOver(unknownKey);
    expect((await post(unknownKey, unknownBody)).status).toBe(201); // paid: the recovery's lookup absent, payout paid
    expect((await post(newKey(), { ...newBody(), amount: '1' })).status).toBe(400); // nothing
    expect(fake.payouts).toHaveLength(3);
    expect(fake.payoutRequests()).toHaveLength(5);

    const after = await sample();
    expect({
      paid: after.paid - before.paid,
      found: after.found - before.found,
      refused: after.refused - before.refused,
      unknown: after.unknown - before.unknown,
      payoutPaid: after.payoutPaid - before.payoutPaid,
      payoutRefused: after.payoutRefused - before.payoutRefused,
      payoutUnknown: after.payoutUnknown - before.payoutUnknown,
      lookupFound: after.lookupFound - before.lookupFound,
      lookupAbsent: after.lookupAbsent - before.lookupAbsent,
      lookupUnknown: after.lookupUnknown - before.lookupUnknown,
    }).toEqual({
      paid: 2,
      found: 1,
      refused: 1,
      // One per 503 request, however many of the provider's answers it saw.
      unknown: 3,
      payoutPaid: 2,
      payoutRefused: 1,
      payoutUnknown: 2,
      lookupFound: 1,
      lookupAbsent: 3,
      lookupUnknown: 1,
    });
  });
});

describe('POST /v1/refunds on the quick start (PAYMENTS_URL unset: the built-in fake provider)', () => {
  let api: ApiHarness;
  let db: DataSource;
  const post = (key: string, body: object) =>
    request(api.server)
      .post('/v1/refunds')
      .set('authorization', bearer(TENANT_A))
      .set('idempotency-key', key)
      .send(body);
  const rowsOf = (refundId: string) => refundRows(db, refundId);
  const recordOf = (key: string) => keyRecord(db, operation(key));

  beforeAll(async () => {
    api = await startApi();
    db = api.app.get(DataSource);
  });
  afterAll(() => api?.close());

  it('pays (201), replays, and refuses 2,000,000 with a stored 422 payment-refused', async () => {
    const key = newKey();
    const body = newBody({ amount: 1999 });
    const first = await post(key, body);
    expect(first.status).toBe(201);
    expect(first.body).toEqual({
      ...paidAnswerOf(key, body, first.body.payout_id),
      payout_id: expect.stringMatching(/^po_[0-9a-f]{24}$/),
    });
    expect(first.headers.location).toBe(`/v1/refunds/${refundIdOf(key)}`);
    expect(await rowsOf(refundIdOf(key))).toEqual([
      paidRow(refundIdOf(key), TENANT_A.tenant, body, first.body.payout_id),
    ]);
    expect(await recordOf(key)).toMatchObject({ state: 'completed', status: 201 });

    const replay = await post(key, body);
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(first.body);
    expect(await rowsOf(refundIdOf(key))).toHaveLength(1);

    const bigKey = newKey();
    const big = newBody({ amount: 2_000_000 });
    const refused = await post(bigKey, big);
    expect(refused.status).toBe(422);
    expect(refused.body.type).toBe(RefundProblemTypes.paymentRefused);
    expect(refused.body.detail).toContain('1000000');
    expect(await rowsOf(refundIdOf(bigKey))).toHaveLength(0);
    expect(await recordOf(bigKey)).toMatchObject({ state: 'completed', status: 422 });
    const refusedAgain = await post(bigKey, big);
    expect(refusedAgain.status).toBe(422);
    expect(refusedAgain.headers['idempotent-replayed']).toBe('true');
    expect(refusedAgain.body).toEqual(refused.body);
  });
});
