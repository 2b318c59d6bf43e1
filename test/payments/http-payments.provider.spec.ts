import { HttpPaymentsProvider, type PayoutRequest } from '@app/payments';
import type { ServerResponse } from 'node:http';
import { RecordingServer } from '../support/recording-server';
import { live, outcomeUnknown } from '../support/refunds';

const json = (res: ServerResponse, status: number, body: unknown): void => {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
};

/**
 * The timeout of the client whose calls nobody answers (`hasty`). Every call that must get its answer goes through
 * `payments`, whose timeout no loaded machine reaches: a short one would make that a bound on latency.
 */
const TIMEOUT_MS = 300;
const PATIENT_MS = 10_000;
const REFERENCE = '3f0c8a52-5b7e-5d0e-9a41-0c2b8e6f1d11';
const REQUEST: PayoutRequest = { reference: REFERENCE, order_id: 'ord_42', amount: 1250, currency: 'EUR' };

describe('HttpPaymentsProvider against a local provider', () => {
  let provider: RecordingServer;
  let payments: HttpPaymentsProvider;
  let hasty: HttpPaymentsProvider;

  beforeEach(async () => {
    provider = await new RecordingServer().start();
    payments = new HttpPaymentsProvider({ baseUrl: provider.url('/v1'), timeoutMs: PATIENT_MS });
    hasty = new HttpPaymentsProvider({ baseUrl: provider.url('/v1'), timeoutMs: TIMEOUT_MS });
  });
  afterEach(() => provider.stop());

  describe('payout', () => {
    it('201 with a payout id is paid; the provider saw the key, the content type and exactly the four fields', async () => {
      provider.handle = (res) => json(res, 201, { payout_id: 'po_1', reference: REFERENCE, status: 'paid' });
      // Extra fields on the request object stay home.
      const result = await payments.payout({ ...REQUEST, ticket_id: 'T-1' } as PayoutRequest, live());

      expect(result).toEqual({ outcome: 'paid', payout: { payout_id: 'po_1', reference: REFERENCE, status: 'paid' } });
      expect(provider.seen).toHaveLength(1);
      const [seen] = provider.seen;
      expect(seen.method).toBe('POST');
      expect(seen.url).toBe('/v1/payouts');
      expect(seen.headers['idempotency-key']).toBe(REFERENCE);
      expect(seen.headers['content-type']).toBe('application/json');
      expect(seen.body.toString()).toBe(
        JSON.stringify({ reference: REFERENCE, order_id: 'ord_42', amount: 1250, currency: 'EUR' }),
      );
    });

    it('any 2xx with a payout id is paid, its reference filled in when the provider leaves it out', async () => {
      provider.handle = (res) => json(res, 200, { payout_id: 'po_2' });
      await expect(payments.payout(REQUEST, live())).resolves.toEqual({
        outcome: 'paid',
        payout: { payout_id: 'po_2', reference: REFERENCE },
      });
    });

    it('422 is a refusal, with the JSON body; a text body is kept as text', async () => {
      const problem = { type: 'https://provider.example/insufficient-funds', title: 'Insufficient funds' };
      provider.handle = (res) => json(res, 422, problem);
      await expect(payments.payout(REQUEST, live())).resolves.toEqual({
        outcome: 'refused',
        status: 422,
        body: problem,
      });

      provider.handle = (res) => res.writeHead(400, { 'content-type': 'text/plain' }).end('bad currency');
      await expect(payments.payout(REQUEST, live())).resolves.toEqual({
        outcome: 'refused',
        status: 400,
        body: 'bad currency',
      });
    });

    it.each([500, 503, 429, 409, 408, 425])('%i leaves the outcome unknown (status)', async (status) => {
      provider.handle = (res) => json(res, status, { error: 'try later' });
      const err = await outcomeUnknown(payments.payout(REQUEST, live()));
      expect(err).toMatchObject({ reason: 'status', status });
    });

    it('a 2xx without a string payout id, or with an unreadable body, leaves it unknown', async () => {
      for (const body of [
        JSON.stringify({ reference: REFERENCE }),
        JSON.stringify({ payout_id: 7 }),
        '{"payout_id": "po_',
        '[]',
      ]) {
        provider.handle = (res) => res.writeHead(201, { 'content-type': 'application/json' }).end(body);
        const err = await outcomeUnknown(payments.payout(REQUEST, live()));
        expect(err).toMatchObject({ reason: 'status', status: 201 });
      }
    });

    it('a 2xx for another reference leaves it unknown', async () => {
      provider.handle = (res) => json(res, 201, { payout_id: 'po_3', reference: 'someone-else' });
      await expect(outcomeUnknown(payments.payout(REQUEST, live()))).resolves.toMatchObject({
        reason: 'status',
        status: 201,
      });
    });

    it('a provider that never answers is unknown (timeout), ended by the timeout and not before it', async () => {
      provider.handle = () => undefined;
      // A timer of the timeout's length set just before the call's own: Node
      // fires timers of one length in the order they were set, so it has
      // fired when the call's deadline ends the call, and not if anything
      // ended it sooner. Nothing else can end a call nobody answers.
      const timeoutPassed = { fired: false };
      setTimeout(() => (timeoutPassed.fired = true), TIMEOUT_MS);
      const err = await outcomeUnknown(hasty.payout(REQUEST, live()));
      expect(timeoutPassed.fired).toBe(true);
      expect(err).toMatchObject({
        reason: 'timeout',
        status: undefined,
        message: `the payment provider did not answer within ${TIMEOUT_MS} ms`,
      });
      expect(provider.seen).toHaveLength(1);
    });

    it('a body that stops halfway is unknown (timeout) too: the deadline covers the body', async () => {
      provider.handle = (res) => {
        res.writeHead(201, { 'content-type': 'application/json', 'content-length': '100' });
        res.write('{"payout_id": ');
      };
      await expect(outcomeUnknown(hasty.payout(REQUEST, live()))).resolves.toMatchObject({ reason: 'timeout' });
    });

    it('a refused connection is unknown (connection)', async () => {
      const closed = await new RecordingServer().start();
      const baseUrl = closed.url('/v1');
      await closed.stop();
      const nowhere = new HttpPaymentsProvider({ baseUrl, timeoutMs: PATIENT_MS });
      const err = await outcomeUnknown(nowhere.payout(REQUEST, live()));
      expect(err).toMatchObject({ reason: 'connection', status: undefined });
      expect(err.message).toContain('ECONNREFUSED');
    });

    it("the caller's abort mid-call is unknown; an abort before the call sends nothing and rejects with its reason", async () => {
      const controller = new AbortController();
      // Aborted once the provider has the request (it never answers): on a busy machine a fixed pause could come
      // before the request arrives.
      provider.handle = () => controller.abort(new Error('client went away'));
      const err = await outcomeUnknown(payments.payout(REQUEST, controller.signal));
      expect(err.reason).toBe('timeout');
      expect(err.cause).toEqual(new Error('client went away'));

      const before = new AbortController();
      const reason = new Error('shutting down');
      before.abort(reason);
      await expect(payments.payout(REQUEST, before.signal)).rejects.toBe(reason);
      expect(provider.seen).toHaveLength(1);
    });
  });

  describe('lookup', () => {
    it('200 with a payout id is the payout; the reference is URL-encoded', async () => {
      const reference = 'ref/with ?&=#+é';
      provider.handle = (res) => json(res, 200, { payout_id: 'po_9', reference, amount: 1250 });
      await expect(payments.lookup(reference, live())).resolves.toEqual({ payout_id: 'po_9', reference, amount: 1250 });

      const [seen] = provider.seen;
      expect(seen.method).toBe('GET');
      expect(seen.url).toBe(`/v1/payouts?reference=${encodeURIComponent(reference)}`);
      expect(new URL(seen.url!, 'http://x').searchParams.get('reference')).toBe(reference);
    });

    it('404 is no payout', async () => {
      provider.handle = (res) => json(res, 404, { error: 'not found' });
      await expect(payments.lookup(REFERENCE, live())).resolves.toBeUndefined();
    });

    it.each([500, 429, 400])('%i is unknown (status)', async (status) => {
      provider.handle = (res) => json(res, status, {});
      await expect(outcomeUnknown(payments.lookup(REFERENCE, live()))).resolves.toMatchObject({
        reason: 'status',
        status,
      });
    });

    it('200 without a payout id is unknown', async () => {
      provider.handle = (res) => json(res, 200, { reference: REFERENCE });
      await expect(outcomeUnknown(payments.lookup(REFERENCE, live()))).resolves.toMatchObject({
        reason: 'status',
        status: 200,
      });
    });

    it('no answer is unknown (timeout)', async () => {
      provider.handle = () => undefined;
      await expect(outcomeUnknown(hasty.lookup(REFERENCE, live()))).resolves.toMatchObject({ reason: 'timeout' });
    });
  });

  it('a trailing slash on the base URL is not doubled', async () => {
    provider.handle = (res) => json(res, 404, {});
    await new HttpPaymentsProvider({ baseUrl: `${provider.url('/v1')}/`, timeoutMs: PATIENT_MS }).lookup('r', live());
    expect(provider.seen[0].url).toBe('/v1/payouts?reference=r');
  });
});
