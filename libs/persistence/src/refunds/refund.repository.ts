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

/** What a refund asked the provider for: the facts a payout was sent with. */
export type RefundFacts = Pick<StoredRefund, 'refundId' | 'tenant' | 'ticketId' | 'orderId' | 'amount' | 'currency'>;

/** A payout sent for a refund not recorded yet (refund_attempts). */
export interface RefundAttempt extends RefundFacts {
  readonly sends: number;
  readonly lastSentAt: Date;
}

/** What the database knows of a refund id: recorded (paid), or sent and not settled, or neither. */
export interface RefundState {
  readonly paid?: StoredRefund;
  readonly attempt?: RefundAttempt;
}

/**
 * The outcome of asking to send a payout: sent (the attempt is recorded, this is its `sends`), or an earlier send is
 * too recent, by this much.
 */
export type SendClaim =
  { readonly sent: true; readonly sends: number } | { readonly sent: false; readonly waitMs: number };

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

interface AttemptJson {
  refund_id: string;
  tenant: string;
  ticket_id: string;
  order_id: string;
  amount: number;
  currency: string;
  sends: number;
  last_sent_at: string;
}

const STATE_SQL = `
SELECT (SELECT row_to_json(r) FROM (SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1) r) AS paid,
       (SELECT row_to_json(a) FROM refund_attempts a WHERE refund_id = $1) AS attempt`;

/*
 * A payout may be sent unless an earlier one for the refund was sent less
 * than $7 ms ago: one statement, so of two requests racing for one refund
 * (a takeover while the first still runs) one sends and one waits.
 */
const CLAIM_SEND_SQL = `
INSERT INTO refund_attempts AS a (refund_id, tenant, ticket_id, order_id, amount, currency)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (refund_id) DO UPDATE SET sends = a.sends + 1, last_sent_at = now()
  WHERE a.last_sent_at <= now() - $7::float8 * interval '1 millisecond'
RETURNING sends`;

const SEND_WAIT_SQL = `
SELECT GREATEST(0, ceil(extract(epoch FROM last_sent_at + $2::float8 * interval '1 millisecond' - now()) * 1000))::float8 AS wait_ms
FROM refund_attempts WHERE refund_id = $1`;

/** I/O only: every method runs in the EntityManager it is given (a transaction's, or the DataSource's own). */
@Injectable()
export class RefundRepository {
  /** The refund's row and its unsettled attempt, in one round trip. */
  async state(em: EntityManager, refundId: string): Promise<RefundState> {
    const [row] = await em.query<
      { paid: (Omit<RefundRow, 'created_at'> & { created_at: string }) | null; attempt: AttemptJson | null }[]
    >(STATE_SQL, [refundId]);
    const paid = row?.paid ? fromRow({ ...row.paid, created_at: new Date(row.paid.created_at) }) : undefined;
    const a = row?.attempt;
    const attempt: RefundAttempt | undefined = a
      ? {
          refundId: a.refund_id,
          tenant: a.tenant,
          ticketId: a.ticket_id,
          orderId: a.order_id,
          amount: a.amount,
          currency: a.currency,
          sends: a.sends,
          lastSentAt: new Date(a.last_sent_at),
        }
      : undefined;
    return { ...(paid ? { paid } : {}), ...(attempt ? { attempt } : {}) };
  }

  /**
   * Records that a payout is about to be sent, unless one was sent less than
   * `quietMs` ago. Committed on its own, before the request leaves: a crash
   * after it leaves the mark for the next request to look up.
   */
  async claimSend(em: EntityManager, facts: RefundFacts, quietMs: number): Promise<SendClaim> {
    const sent: { sends: number }[] = await em.query(CLAIM_SEND_SQL, [
      facts.refundId,
      facts.tenant,
      facts.ticketId,
      facts.orderId,
      facts.amount,
      facts.currency,
      quietMs,
    ]);
    if (sent[0]) return { sent: true, sends: sent[0].sends };
    const [wait] = await em.query<{ wait_ms: number }[]>(SEND_WAIT_SQL, [facts.refundId, quietMs]);
    return { sent: false, waitMs: wait?.wait_ms ?? quietMs };
  }

  /**
   * Records a paid refund. A refund id names one refund for ever: a second
   * insert of the same id leaves the first row as it was and returns it.
   */
  async record(em: EntityManager, refund: NewRefund): Promise<StoredRefund> {
    // Recorded, its send mark goes in the same statement: nothing is unknown about its payout any more.
    const inserted: RefundRow[] = await em.query(
      `WITH settled AS (DELETE FROM refund_attempts WHERE refund_id = $1)
       INSERT INTO refunds (refund_id, tenant, ticket_id, order_id, amount, currency, payout_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7)
       ON CONFLICT (refund_id) DO NOTHING
       RETURNING ${COLUMNS}`,
      [
        refund.refundId,
        refund.tenant,
        refund.ticketId,
        refund.orderId,
        refund.amount,
        refund.currency,
        refund.payoutId,
      ],
    );
    if (inserted[0]) return fromRow(inserted[0]);
    const existing = await this.find(em, refund.refundId);
    if (!existing) throw new Error(`refund ${refund.refundId} neither inserted nor found`);
    return existing;
  }

  /**
   * Removes the send mark of a payout the provider refused, when that refusal
   * answered the mark's last send (`sends`): no payout with the reference can
   * exist then (every earlier send was looked up absent before this one was
   * let go). A later send (a takeover once the resend window passed) is
   * another payout whose outcome nobody knows yet: its mark stays. Run in the
   * transaction that stores the refusal, so the refusal is never stored with
   * its mark still standing nor the mark gone with no refusal stored.
   */
  async settleRefused(em: EntityManager, refundId: string, sends: number): Promise<boolean> {
    // TypeORM answers a DELETE with [rows, rowCount], not with the rows alone.
    const [, deleted] = await em.query<[unknown[], number]>(
      `DELETE FROM refund_attempts WHERE refund_id = $1 AND sends = $2`,
      [refundId, sends],
    );
    return deleted === 1;
  }

  async find(em: EntityManager, refundId: string): Promise<StoredRefund | undefined> {
    const rows: RefundRow[] = await em.query(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1`, [refundId]);
    return rows[0] && fromRow(rows[0]);
  }

  async findForTenant(em: EntityManager, refundId: string, tenant: string): Promise<StoredRefund | undefined> {
    const rows: RefundRow[] = await em.query(`SELECT ${COLUMNS} FROM refunds WHERE refund_id = $1 AND tenant = $2`, [
      refundId,
      tenant,
    ]);
    return rows[0] && fromRow(rows[0]);
  }
}
