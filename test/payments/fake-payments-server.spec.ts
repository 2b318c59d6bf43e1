import { HttpPaymentsProvider, type PayoutRequest } from '@app/payments';
import { setTimeout as sleep } from 'node:timers/promises';
import { DEFAULT_REFUSAL, FakePaymentsServer } from '../support/fake-payments-server';
import { live, outcomeUnknown } from '../support/refunds';

/**
 * The timeout of the client whose calls must time out (`hasty`): the fake's slow answers are 100 ms past it, and
 * Node fires the client's timer, set first, before the fake's. Every call that must get its answer goes through
 * `payments`, whose timeout no loaded machine reaches: a short one would make that a bound on latency.
 */
const TIMEOUT_MS = 150;
const PATIENT_MS = 10_000;
const REFERENCE = '7d1e4c0a-2f3b-4c5d-8e9f-0a1b2c3d4e5f';
const REQUEST: PayoutRequest = { reference: REFERENCE, order_id: 'ord_7', amount: 1999, currency: 'EUR' };

/** Whether `promise` is still pending after `ms`. */
async function pendingAfter(promise: Promise<unknown>, ms: number): Promise<boolean> {
  const PENDING = Symbol('pending');
  const winner = await Promise.race([
    promise.then(
      () => 'settled',
      () => 'settled',
    ),
    sleep(ms, PENDING),
  ]);
  return winner === PENDING;
}

describe('FakePaymentsServer driven by the production HttpPaymentsProvider', () => {
  let server: FakePaymentsServer;
  let payments: HttpPaymentsProvider;
  let hasty: HttpPaymentsProvider;

  beforeEach(async () => {
    server = await new FakePaymentsServer().start();
    payments = new HttpPaymentsProvider({ baseUrl: server.url(), timeoutMs: PATIENT_MS });
    hasty = new HttpPaymentsProvider({ baseUrl: server.url(), timeoutMs: TIMEOUT_MS });
  });
  afterEach(() => server.stop());

  it('url() is the base (PAYMENTS_URL): http://127.0.0.1:<port>', () => {
    expect(server.url()).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  });

  describe('payouts', () => {
    it('does not dedupe: two payouts with one reference and one Idempotency-Key are two payouts', async () => {
      const first = await payments.payout(REQUEST, live());
      const second = await payments.payout(REQUEST, live());

      expect(first).toEqual({
        outcome: 'paid',
        payout: expect.objectContaining({
          payout_id: expect.stringMatching(/^po_1_[0-9a-f]+$/),
          reference: REFERENCE,
          status: 'paid',
        }),
      });
      expect(second).toEqual({
        outcome: 'paid',
        payout: expect.objectContaining({ payout_id: expect.stringMatching(/^po_2_/) }),
      });
      if (first.outcome !== 'paid' || second.outcome !== 'paid') throw new Error('unreachable');
      expect(second.payout.payout_id).not.toBe(first.payout.payout_id);

      expect(server.payouts).toHaveLength(2);
      expect(server.payoutsFor(REFERENCE).map((p) => p.payout_id)).toEqual([
        first.payout.payout_id,
        second.payout.payout_id,
      ]);
      expect(server.payoutsFor('another')).toEqual([]);
      expect(server.payouts[0]).toEqual({
        payout_id: first.payout.payout_id,
        reference: REFERENCE,
        order_id: 'ord_7',
        amount: 1999,
        currency: 'EUR',
        idempotencyKey: REFERENCE,
        created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
      });

      // The lookup answers the first payout.
      await expect(payments.lookup(REFERENCE, live())).resolves.toEqual(
        expect.objectContaining({
          payout_id: first.payout.payout_id,
          reference: REFERENCE,
          order_id: 'ord_7',
          amount: 1999,
          currency: 'EUR',
          status: 'paid',
        }),
      );
    });

    it('records every request: method, path with query, headers, parsed body', async () => {
      await payments.payout(REQUEST, live());
      await payments.lookup('no such', live());

      expect(server.requests.map((r) => [r.n, r.method, r.path])).toEqual([
        [1, 'POST', '/payouts'],
        [2, 'GET', '/payouts?reference=no%20such'],
      ]);
      const [post] = server.payoutRequests();
      expect(post.headers['idempotency-key']).toBe(REFERENCE);
      expect(post.headers['content-type']).toBe('application/json');
      expect(post.body).toEqual({ reference: REFERENCE, order_id: 'ord_7', amount: 1999, currency: 'EUR' });
      expect(server.lookupRequests()).toHaveLength(1);
      expect(server.lookupRequests()[0].body).toBeUndefined();
    });

    it('pay with a delay over the client timeout: unknown (timeout), yet the payout was made and lookup finds it', async () => {
      server.nextPayouts({ kind: 'pay', delayMs: TIMEOUT_MS + 100 });
      const err = await outcomeUnknown(hasty.payout(REQUEST, live()));
      expect(err.reason).toBe('timeout');

      expect(server.payoutsFor(REFERENCE)).toHaveLength(1);
      // The lookup is answered as late as the payout was, on a timer of the fake's set after the payout's (Node fires
      // timers of one length in the order they were set): once it has its answer, the late answer has been written
      // to a client that has gone, harmlessly.
      server.nextLookups({ kind: 'answer', delayMs: TIMEOUT_MS + 100 });
      await expect(payments.lookup(REFERENCE, live())).resolves.toEqual(
        expect.objectContaining({ payout_id: server.payouts[0].payout_id }),
      );
      expect(server.payouts).toHaveLength(1);
    });

    it('pay with a delay under the client timeout is paid', async () => {
      server.nextPayouts({ kind: 'pay', delayMs: 50 });
      await expect(payments.payout(REQUEST, live())).resolves.toEqual(expect.objectContaining({ outcome: 'paid' }));
    });

    it('drop: unknown (connection), nothing registered, and the lookup (404) finds none', async () => {
      server.nextPayouts({ kind: 'drop' });
      const err = await outcomeUnknown(payments.payout(REQUEST, live()));
      expect(err.reason).toBe('connection');

      expect(server.payoutRequests()).toHaveLength(1);
      expect(server.payouts).toEqual([]);
      await expect(payments.lookup(REFERENCE, live())).resolves.toBeUndefined();
    });

    it('pay-then-drop: unknown (connection), but the payout was made', async () => {
      server.nextPayouts({ kind: 'pay-then-drop' });
      const err = await outcomeUnknown(payments.payout(REQUEST, live()));
      expect(err.reason).toBe('connection');

      expect(server.payoutsFor(REFERENCE)).toHaveLength(1);
      await expect(payments.lookup(REFERENCE, live())).resolves.toEqual(
        expect.objectContaining({ payout_id: server.payouts[0].payout_id }),
      );
    });

    it('refuse: refused 422 with the default problem body, or the status and body given; nothing registered', async () => {
      server.nextPayouts(
        { kind: 'refuse' },
        { kind: 'refuse', status: 400, body: { type: 'bad-currency', title: 'Unknown currency' } },
      );
      await expect(payments.payout(REQUEST, live())).resolves.toEqual({
        outcome: 'refused',
        status: 422,
        body: DEFAULT_REFUSAL,
      });
      expect(DEFAULT_REFUSAL).toEqual({
        type: 'insufficient-funds',
        title: 'Insufficient funds in the merchant balance',
      });
      await expect(payments.payout(REQUEST, live())).resolves.toEqual({
        outcome: 'refused',
        status: 400,
        body: { type: 'bad-currency', title: 'Unknown currency' },
      });
      expect(server.payouts).toEqual([]);
    });

    it('fail 500 with pay: unknown (status 500), and the payout was made; fail without pay registers nothing', async () => {
      server.nextPayouts({ kind: 'fail', pay: true }, { kind: 'fail', status: 503 });
      const paid = await outcomeUnknown(payments.payout(REQUEST, live()));
      expect([paid.reason, paid.status]).toEqual(['status', 500]);
      expect(server.payoutsFor(REFERENCE)).toHaveLength(1);

      const other = { ...REQUEST, reference: 'ref-2' };
      const unpaid = await outcomeUnknown(payments.payout(other, live()));
      expect([unpaid.reason, unpaid.status]).toEqual(['status', 503]);
      expect(server.payoutsFor('ref-2')).toEqual([]);
    });

    it('hang: unknown (timeout), nothing registered', async () => {
      server.nextPayouts({ kind: 'hang' });
      const err = await outcomeUnknown(hasty.payout(REQUEST, live()));
      expect(err.reason).toBe('timeout');
      expect(server.payoutRequests()).toHaveLength(1);
      expect(server.payouts).toEqual([]);
    });

    it('gate: registered on arrival, held in flight until the gate is released, then 201 with that payout', async () => {
      const patient = new HttpPaymentsProvider({ baseUrl: server.url(), timeoutMs: 2000 });
      let release!: () => void;
      server.nextPayouts({ kind: 'gate', gate: new Promise<void>((r) => (release = r)) });

      const call = patient.payout(REQUEST, live());
      await server.arrivals(1, 1000);
      expect(server.payoutsFor(REFERENCE)).toHaveLength(1);
      expect(await pendingAfter(call, 100)).toBe(true);

      release();
      await expect(call).resolves.toEqual({
        outcome: 'paid',
        payout: expect.objectContaining({ payout_id: server.payouts[0].payout_id }),
      });
    });

    it('gate with pay: false registers nothing and answers a refusal once released (a rejected gate releases too)', async () => {
      const patient = new HttpPaymentsProvider({ baseUrl: server.url(), timeoutMs: 2000 });
      let fail!: (err: Error) => void;
      const gate = new Promise<void>((_, reject) => (fail = reject));
      gate.catch(() => undefined);
      server.nextPayouts({ kind: 'gate', pay: false, gate });

      const call = patient.payout(REQUEST, live());
      await server.arrivals(1, 1000);
      expect(await pendingAfter(call, 50)).toBe(true);
      fail(new Error('let go'));
      await expect(call).resolves.toEqual({ outcome: 'refused', status: 422, body: DEFAULT_REFUSAL });
      expect(server.payouts).toEqual([]);
    });

    it('behaviours are consumed in order, then the default applies; defaultPayout makes every call slow', async () => {
      server.nextPayouts({ kind: 'refuse' }, { kind: 'drop' });
      await expect(payments.payout(REQUEST, live())).resolves.toEqual(expect.objectContaining({ outcome: 'refused' }));
      expect((await outcomeUnknown(payments.payout(REQUEST, live()))).reason).toBe('connection');
      await expect(payments.payout(REQUEST, live())).resolves.toEqual(expect.objectContaining({ outcome: 'paid' }));

      server.defaultPayout = { kind: 'pay', delayMs: TIMEOUT_MS + 100 };
      expect((await outcomeUnknown(hasty.payout(REQUEST, live()))).reason).toBe('timeout');
      expect((await outcomeUnknown(hasty.payout(REQUEST, live()))).reason).toBe('timeout');
      expect(server.payoutsFor(REFERENCE)).toHaveLength(3);
    });
  });

  describe('lookups', () => {
    it('404 {"error"} when no payout has the reference; the provider reads it as none', async () => {
      const res = await fetch(`${server.url()}/payouts?reference=nope`);
      expect(res.status).toBe(404);
      expect(await res.json()).toEqual({ error: 'no payout with that reference' });
      await expect(payments.lookup('nope', live())).resolves.toBeUndefined();
    });

    it('fail: unknown (status 503 by default, or the status given)', async () => {
      await payments.payout(REQUEST, live());
      server.nextLookups({ kind: 'fail' }, { kind: 'fail', status: 500 });
      const first = await outcomeUnknown(payments.lookup(REFERENCE, live()));
      expect([first.reason, first.status]).toEqual(['status', 503]);
      const second = await outcomeUnknown(payments.lookup(REFERENCE, live()));
      expect([second.reason, second.status]).toEqual(['status', 500]);
      // The queue is empty again: the default answers.
      await expect(payments.lookup(REFERENCE, live())).resolves.toEqual(
        expect.objectContaining({ reference: REFERENCE }),
      );
    });

    it('drop: unknown (connection); hang and a slow answer: unknown (timeout)', async () => {
      await payments.payout(REQUEST, live());
      server.nextLookups(
        { kind: 'drop' },
        { kind: 'hang' },
        { kind: 'answer', delayMs: TIMEOUT_MS + 100 },
        { kind: 'answer', delayMs: 20 },
      );
      expect((await outcomeUnknown(payments.lookup(REFERENCE, live()))).reason).toBe('connection');
      expect((await outcomeUnknown(hasty.lookup(REFERENCE, live()))).reason).toBe('timeout');
      expect((await outcomeUnknown(hasty.lookup(REFERENCE, live()))).reason).toBe('timeout');
      await expect(payments.lookup(REFERENCE, live())).resolves.toEqual(
        expect.objectContaining({ reference: REFERENCE }),
      );
      expect(server.lookupRequests()).toHaveLength(4);
    });

    it('defaultLookup applies when the queue is empty', async () => {
      server.defaultLookup = { kind: 'fail', status: 502 };
      expect((await outcomeUnknown(payments.lookup(REFERENCE, live()))).status).toBe(502);
      expect((await outcomeUnknown(payments.lookup(REFERENCE, live()))).status).toBe(502);
    });
  });

  describe('arrivals', () => {
    it('resolves once n payout requests have arrived, at once when they already have', async () => {
      server.defaultPayout = { kind: 'hang' };
      const two = server.arrivals(2, 1000);
      void hasty.payout(REQUEST, live()).catch(() => undefined);
      expect(await pendingAfter(two, 50)).toBe(true);
      void hasty.payout(REQUEST, live()).catch(() => undefined);
      await expect(two).resolves.toBeUndefined();
      await expect(server.arrivals(1, 10)).resolves.toBeUndefined();
      expect(server.payouts).toEqual([]);
    });

    it('rejects with a clear error after the timeout', async () => {
      await payments.payout(REQUEST, live());
      await expect(server.arrivals(3, 100)).rejects.toThrow('expected 3 payout request(s) within 100 ms, 1 arrived');
    });

    it('lookupArrivals counts lookups only', async () => {
      await payments.payout(REQUEST, live());
      await expect(server.lookupArrivals(1, 100)).rejects.toThrow(
        'expected 1 lookup request(s) within 100 ms, 0 arrived',
      );
      await payments.lookup(REFERENCE, live());
      await expect(server.lookupArrivals(1, 100)).resolves.toBeUndefined();
    });
  });

  describe('a real provider’s edges', () => {
    it('unknown paths are 404; other methods on /payouts are 405', async () => {
      expect((await fetch(`${server.url()}/refunds`, { method: 'POST', body: '{}' })).status).toBe(404);
      expect((await fetch(`${server.url()}/v1/payouts`)).status).toBe(404);
      expect((await fetch(`${server.url()}/payouts`, { method: 'DELETE' })).status).toBe(405);
    });

    it('a malformed JSON body is 400, registers nothing and takes no queued behaviour', async () => {
      server.nextPayouts({ kind: 'refuse', status: 402 });
      const post = (body: string) =>
        fetch(`${server.url()}/payouts`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': 'k' },
          body,
        });

      const malformed = await post('{"reference": "r1", ');
      expect(malformed.status).toBe(400);
      expect(await malformed.json()).toEqual(expect.objectContaining({ detail: 'the body is not JSON' }));
      expect(
        (await post(JSON.stringify({ reference: 'r1', order_id: 'o', amount: 1.5, currency: 'EUR' }))).status,
      ).toBe(400);
      expect(
        (
          await fetch(`${server.url()}/payouts`, {
            method: 'POST',
            headers: { 'content-type': 'text/plain' },
            body: JSON.stringify(REQUEST),
          })
        ).status,
      ).toBe(415);
      expect((await fetch(`${server.url()}/payouts`)).status).toBe(400); // a lookup without a reference
      expect(server.payouts).toEqual([]);
      expect(server.payoutRequests()).toHaveLength(3);
      expect(server.payoutRequests()[0].body).toBeUndefined();
      expect(server.payoutRequests()[0].rawBody).toBe('{"reference": "r1", ');

      // The queued refusal is still the next one's.
      await expect(payments.payout(REQUEST, live())).resolves.toEqual(
        expect.objectContaining({ outcome: 'refused', status: 402 }),
      );
    });

    it("on('payout') hears every payout as it is made", async () => {
      const heard: string[] = [];
      server.on('payout', (p) => heard.push(p.payout_id));
      server.nextPayouts({ kind: 'pay-then-drop' });
      await outcomeUnknown(payments.payout(REQUEST, live()));
      await payments.payout(REQUEST, live());
      expect(heard).toEqual(server.payouts.map((p) => p.payout_id));
      expect(heard).toHaveLength(2);
    });
  });

  describe('stop', () => {
    it('destroys hanging and gated requests, rejects pending arrivals, and is idempotent', async () => {
      // Every wait is an hour or more: only stop() can end these calls within the test's time.
      const patient = new HttpPaymentsProvider({ baseUrl: server.url(), timeoutMs: 3_600_000 });
      server.nextPayouts(
        { kind: 'hang' },
        { kind: 'gate', gate: new Promise(() => undefined) },
        { kind: 'pay', delayMs: 3_600_000 },
      );
      server.nextLookups({ kind: 'hang' });
      // Each outcome caught at once: they settle during stop(), before they are awaited.
      const calls = [
        patient.payout(REQUEST, live()),
        patient.payout(REQUEST, live()),
        patient.payout(REQUEST, live()),
        patient.lookup(REFERENCE, live()),
      ].map((call) => outcomeUnknown(call));
      await server.arrivals(3, 1000);
      await server.lookupArrivals(1, 1000);
      const never = server.arrivals(10, 60_000).then(
        () => undefined,
        (e: unknown) => e,
      );

      await server.stop();
      await server.stop();

      for (const call of calls) expect((await call).reason).toBe('connection');
      expect(await never).toEqual(new Error('FakePaymentsServer: stopped while waiting for 10 payout request(s)'));
      await expect(server.arrivals(11, 10)).rejects.toThrow('stopped');
    });

    it('a server never started stops quietly', async () => {
      await expect(new FakePaymentsServer().stop()).resolves.toBeUndefined();
    });
  });
});
