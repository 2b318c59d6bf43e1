import type { ApiResult, Refund } from '@app/client';
import { refundToolReply } from './issue-refund.tool';

/** What the agent is told for each of the three outcomes. */
describe('the issue_refund tool: outcomes in words for the agent', () => {
  const refund: Refund = {
    refund_id: '3f0c6b1e-5d1c-5a57-9a0e-0a1b2c3d4e5f',
    ticket_id: 'T-1042',
    order_id: 'O-77',
    amount: 1999,
    currency: 'EUR',
    payout_id: 'po_123',
    status: 'paid',
  };

  it('succeeded: refunded, with the ids', () => {
    const reply = refundToolReply({ outcome: 'succeeded', status: 201, body: refund, replayed: true, attempts: 2 });
    expect(reply).toMatchObject({ status: 'refunded', refund_id: refund.refund_id, payout_id: 'po_123' });
    expect(reply.message).toContain('19.99 EUR');
  });

  it('rejected: refused, with the reason, and nothing was paid', () => {
    const result: ApiResult<Refund> = {
      outcome: 'rejected',
      status: 422,
      problem: {
        type: 'https://example.com/problems/payment-refused',
        title: 'Payment refused',
        detail: 'The order was already refunded in full.',
      },
      attempts: 1,
    };
    const reply = refundToolReply(result);
    expect(reply).toMatchObject({ status: 'refused', reason: 'The order was already refunded in full.' });
    expect(reply.message).toMatch(/nothing was paid/);
  });

  it.each(['deadline', 'aborted', 'attempts'] as const)(
    'unknown (%s): pending, never "failed", and no new request',
    (reason) => {
      const reply = refundToolReply({ outcome: 'unknown', reason, attempts: 3 });
      expect(reply.status).toBe('pending');
      expect(reply.message).toMatch(/still being processed/);
      expect(reply.message).toMatch(/do not retry with a new request/);
      expect(reply.message).not.toMatch(/\bhas failed\b/);
    },
  );
});
