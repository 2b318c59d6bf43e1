import { Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';

/** A paid refund as the `refunds` table holds it. */
export interface StoredRefund {
  readonly refundId: string;
  readonly tenant: string;
  readonly ticketId: string;
  readonly orderId: string;
  /** Integer minor units. */
  readonly amount: number;
  readonly currency: string;
  readonly payoutId: string;
  readonly createdAt: Date;
}

export type NewRefund = Omit<StoredRefund, 'createdAt'>;

interface RefundRow {
  refund_id: string;
  tenant: string;
  ticket_id: string;
  order_id: string;
  amount: number;
  currency: string;
  payout_id: string;
  created_at: Date;
}

const COLUMNS = 'refund_id, tenant, ticket_id, order_id, amount, currency, payout_id, created_at';

const fromRow = (r: RefundRow): StoredRefund => ({
  refundId: r.refund_id,
  tenant: r.tenant,
  ticketId: r.ticket_id,
  orderId: r.order_id,
  amount: r.amount,
  currency: r.currency,
  payoutId: r.payout_id,
  createdAt: r.created_at,
});

/** I/O only: every method runs in the EntityManager it is given (a transaction's, or the DataSource's own). */
@Injectable()
export class RefundRepository {
  /**
   * Records a paid refund. A refund id names one refund for ever: a second
   * insert of the same id leaves the first row as it was and returns it.
   */
  async record(em: EntityManager, refund: NewRefund): Promise<StoredRefund> {
    const inserted: RefundRow[] = await em.query(
      `INSERT INTO refunds (refund_id, tenant, ticket_id, order_id, amount, currency, payout_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7)
       ON CONFLICT (refund_id) DO NOTHING
       RETURNING ${COLUMNS}`,
      [refund.refundId, refund.tenant, refund.ticketId, refund.orderId, refund.amount, refund.currency, refund.payoutId],
    );
    if (inserted[0]) return fromRow(inserted[0]);
    const existing = await this.find(em, refund.refundId);
    if (!existing) throw new Error(`refund ${refund.refundId} neither inserted nor found`);
    return existing;
  }

  async find(em: EntityManager, refundId: string): Promise<StoredRefund | undefined> {
    const rows: RefundRow[] = await em.query(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1`, [refundId]);
    return rows[0] && fromRow(rows[0]);
  }

  async findForTenant(em: EntityManager, refundId: string, tenant: string): Promise<StoredRefund | undefined> {
    const rows: RefundRow[] = await em.query(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1 AND tenant = $2`, [refundId, tenant]);
    return rows[0] && fromRow(rows[0]);
  }
}
