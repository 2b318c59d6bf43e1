import { lookupResultFrom, payoutResultFrom } from './http-payments.provider';
import { PaymentOutcomeUnknownError } from './payments-provider';

const REF = 'ref-1';

describe('payoutResultFrom: what a payout answer settles', () => {
  it.each([
    [
      201,
      '{"payout_id":"po_1","reference":"ref-1"}',
      { outcome: 'paid', payout: { payout_id: 'po_1', reference: REF } },
    ],
    [200, '{"payout_id":"po_1"}', { outcome: 'paid', payout: { payout_id: 'po_1', reference: REF } }],
    [422, '{"type":"x"}', { outcome: 'refused', status: 422, body: { type: 'x' } }],
    [400, 'no', { outcome: 'refused', status: 400, body: 'no' }],
    [404, '', { outcome: 'refused', status: 404, body: '' }],
  ])('%i %s → %j', (status, text, expected) => {
    expect(payoutResultFrom({ status, text }, REF)).toEqual(expected);
  });

  it.each([
    [500, '{}'],
    [502, ''],
    [408, ''],
    [409, ''],
    [425, ''],
    [429, ''],
    [302, ''],
    [201, '{}'],
    [201, '{"payout_id":""}'],
    [201, '{"payout_id":1}'],
    [201, 'not json'],
    [201, 'null'],
    [201, '{"payout_id":"po_1","reference":"other"}'],
  ])('%i %s → unknown (status)', (status, text) => {
    expect(() => payoutResultFrom({ status, text }, REF)).toThrow(
      expect.objectContaining({ reason: 'status', status }),
    );
    expect(() => payoutResultFrom({ status, text }, REF)).toThrow(PaymentOutcomeUnknownError);
  });
});

describe('lookupResultFrom: what a lookup answer settles', () => {
  it('200 with a payout id is the payout, 404 is none', () => {
    expect(lookupResultFrom({ status: 200, text: '{"payout_id":"po_1","reference":"ref-1","x":1}' }, REF)).toEqual({
      payout_id: 'po_1',
      reference: REF,
      x: 1,
    });
    expect(lookupResultFrom({ status: 404, text: 'nope' }, REF)).toBeUndefined();
  });

  it.each([
    [200, '{}'],
    [200, 'garbage'],
    [201, '{"payout_id":"po_1"}'],
    [400, ''],
    [429, ''],
    [500, ''],
  ])('%i %s → unknown (status)', (status, text) => {
    expect(() => lookupResultFrom({ status, text }, REF)).toThrow(PaymentOutcomeUnknownError);
  });
});
