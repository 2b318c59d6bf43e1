import { FAKE_PAYOUT_LIMIT, FakePaymentsProvider } from './fake-payments.provider';
import type { PayoutRequest } from './payments-provider';

const request = (overrides: Partial<PayoutRequest> = {}): PayoutRequest => ({
  reference: '3f0c8a52-5b7e-5d0e-9a41-0c2b8e6f1d11',
  order_id: 'ord_1',
  amount: 1250,
  currency: 'EUR',
  ...overrides,
});
const live = (): AbortSignal => new AbortController().signal;

describe('FakePaymentsProvider', () => {
  it('pays: a po_ payout id and the request echoed', async () => {
    const result = await new FakePaymentsProvider().payout(request(), live());
    expect(result).toEqual({
      outcome: 'paid',
      payout: expect.objectContaining({
        reference: request().reference,
        order_id: 'ord_1',
        amount: 1250,
        currency: 'EUR',
      }),
    });
    expect(result.outcome === 'paid' && result.payout.payout_id).toMatch(/^po_[0-9a-f]{24}$/);
  });

  it('gives a second payout with the same reference the first one, and others their own', async () => {
    const fake = new FakePaymentsProvider();
    const first = await fake.payout(request(), live());
    const again = await fake.payout(request({ amount: 99 }), live());
    const other = await fake.payout(request({ reference: 'other' }), live());
    expect(again).toEqual(first);
    expect(other.outcome === 'paid' && other.payout.payout_id).not.toBe(
      first.outcome === 'paid' && first.payout.payout_id,
    );
  });

  it('refuses an amount over the limit with a 422 and records nothing; the limit itself is paid', async () => {
    const fake = new FakePaymentsProvider();
    const refused = await fake.payout(request({ amount: FAKE_PAYOUT_LIMIT + 1 }), live());
    expect(refused).toEqual({
      outcome: 'refused',
      status: 422,
      body: expect.objectContaining({ type: 'amount-over-limit' }),
    });
    await expect(fake.lookup(request().reference, live())).resolves.toBeUndefined();
    await expect(fake.payout(request({ amount: FAKE_PAYOUT_LIMIT }), live())).resolves.toMatchObject({
      outcome: 'paid',
    });
  });

  it('looks payouts up by reference', async () => {
    const fake = new FakePaymentsProvider();
    await expect(fake.lookup(request().reference, live())).resolves.toBeUndefined();
    const paid = await fake.payout(request(), live());
    await expect(fake.lookup(request().reference, live())).resolves.toEqual(
      paid.outcome === 'paid' ? paid.payout : undefined,
    );
    await expect(fake.lookup('someone-else', live())).resolves.toBeUndefined();
  });

  it('honours an aborted signal: rejects with its reason and pays nothing', async () => {
    const fake = new FakePaymentsProvider();
    const controller = new AbortController();
    const reason = new Error('shutting down');
    controller.abort(reason);
    await expect(fake.payout(request(), controller.signal)).rejects.toBe(reason);
    await expect(fake.lookup(request().reference, controller.signal)).rejects.toBe(reason);
    await expect(fake.lookup(request().reference, live())).resolves.toBeUndefined();
  });
});
