import { RefundRepository, type RefundFacts } from '@app/persistence';
import type { DataSource } from 'typeorm';
import { testDataSource } from '../support/infra';

describe('RefundRepository.settleRefused (a refusal removes the mark only of the send it answered)', () => {
  let ds: DataSource;
  const rows = new RefundRepository();
  const facts: RefundFacts = {
    refundId: '3b0e4f6a-8c1d-4e2f-9a3b-5c6d7e8f9a01',
    tenant: 'acme',
    ticketId: 'T-1',
    orderId: 'O-1',
    amount: 1250,
    currency: 'EUR',
  };
  const marks = () => ds.query<{ refund_id: string; sends: number }[]>('SELECT refund_id, sends FROM refund_attempts');

  beforeAll(async () => {
    ds = await testDataSource();
  });
  afterAll(() => ds.destroy());
  beforeEach(() => ds.query('TRUNCATE refund_attempts, refunds'));

  /** A mark whose last send is its `sends`-th: a quiet window of 0 lets every claim send again. */
  async function markSent(times: number): Promise<void> {
    for (let i = 0; i < times; i++) await rows.claimSend(ds.manager, facts, 0);
  }

  it("removes the mark when the refusal answered the mark's last send", async () => {
    await markSent(1);
    await expect(rows.settleRefused(ds.manager, facts.refundId, 1)).resolves.toBe(true);
    expect(await marks()).toEqual([]);
  });

  it('keeps the mark of a later send (a takeover sent again): false, and the row stays as it was', async () => {
    await markSent(2);
    expect(await marks()).toEqual([{ refund_id: facts.refundId, sends: 2 }]);
    await expect(rows.settleRefused(ds.manager, facts.refundId, 1)).resolves.toBe(false);
    expect(await marks()).toEqual([{ refund_id: facts.refundId, sends: 2 }]);
  });

  it('is false when there is no mark at all', async () => {
    await expect(rows.settleRefused(ds.manager, facts.refundId, 1)).resolves.toBe(false);
  });
});
