import type { Refund, RefundRequest } from '@app/client';
import { PaymentOutcomeUnknownError } from '@app/payments';
import type { DataSource } from 'typeorm';
import type { FakePaymentsServer, FakeRequest } from './fake-payments-server';

/*
 * What the refunds suites share (the api's, the killed process's, the
 * client's through a proxy, and the payment provider's): the `refunds` rows,
 * `refund_attempts` marks and `idempotency_keys` records as the tests read
 * (and age) them, the answer and row a paid refund leaves, and the
 * provider's unknown outcome.
 */

/** The idempotency_keys key of `tenant`'s POST /v1/refunds with Idempotency-Key `key` (what refundIdFor takes). */
export const refundOperation = (tenant: string, key: string): string => `${tenant}:POST:/v1/refunds:${key}`;

/** A `refunds` row as the tests read it (created_at aside): the answer's fields but status, and the tenant. */
export type RefundRow = Omit<Refund, 'status' | 'created_at'> & { readonly tenant: string };

/** The `refunds` rows with this refund id. */
export const refundRows = async (db: DataSource, refundId: string): Promise<RefundRow[]> =>
  await db.query<RefundRow[]>(
    `SELECT refund_id, tenant, ticket_id, order_id, amount, currency, payout_id FROM refunds WHERE refund_id = $1`,
    [refundId],
  );

/** The row a refund of `body` by `tenant`, paid with `payoutId`, leaves in `refunds`. */
export const paidRow = (refundId: string, tenant: string, body: RefundRequest, payoutId: string): RefundRow => ({
  refund_id: refundId,
  tenant,
  ticket_id: body.ticket_id,
  order_id: body.order_id,
  amount: body.amount,
  currency: body.currency,
  payout_id: payoutId,
});

/** The 201 a refund of `body`, paid with `payoutId`, answers (and stores). */
export const paidAnswer = (refundId: string, body: RefundRequest, payoutId: string): Refund => ({
  refund_id: refundId,
  ticket_id: body.ticket_id,
  order_id: body.order_id,
  amount: body.amount,
  currency: body.currency,
  payout_id: payoutId,
  status: 'paid',
});

/** A key's record in `idempotency_keys`. */
export interface KeyRecord {
  readonly state: 'running' | 'completed';
  readonly status: number | null;
  /** The stored answer's body, as text. */
  readonly body: string | null;
  readonly token: string | null;
  readonly locked_until: Date | null;
  /** locked_until <= now(): an abandoned (or dead) request's key, for the next one to take over. */
  readonly lock_expired: boolean | null;
}

/** The record of this operation (see refundOperation), if any. */
export const keyRecord = async (db: DataSource, operation: string): Promise<KeyRecord | undefined> =>
  (
    await db.query<KeyRecord[]>(
      `SELECT state, status, body, token, locked_until, locked_until <= now() AS lock_expired FROM idempotency_keys WHERE key = $1`,
      [operation],
    )
  )[0];

/**
 * A `refund_attempts` row as the tests read it: the mark committed before a
 * payout request leaves, deleted in the transaction that records the refund.
 */
export interface AttemptRow {
  readonly refund_id: string;
  readonly tenant: string;
  readonly ticket_id: string;
  readonly order_id: string;
  readonly amount: number;
  readonly currency: string;
  /** How many payout requests were sent for the refund (each claimed its send). */
  readonly sends: number;
  readonly first_sent_at: Date;
  readonly last_sent_at: Date;
}

/** The `refund_attempts` rows (0 or 1) of this refund id. */
export const attemptRows = async (db: DataSource, refundId: string): Promise<AttemptRow[]> =>
  await db.query<AttemptRow[]>(
    `SELECT refund_id, tenant, ticket_id, order_id, amount, currency, sends, first_sent_at, last_sent_at FROM refund_attempts WHERE refund_id = $1`,
    [refundId],
  );

/** The affected-row count of an UPDATE or DELETE run through DataSource.query (TypeORM answers `[rows, count]`). */
const affected = (result: unknown): number => (result as [unknown[], number])[1];

/**
 * Moves the refund's last send an hour into the past: the resend window
 * (2 × PAYMENTS_TIMEOUT_S) is over, as if waited out. Fails unless the mark stands.
 */
export async function ageAttempt(db: DataSource, refundId: string): Promise<void> {
  const n = affected(
    await db.query(`UPDATE refund_attempts SET last_sent_at = now() - interval '1 hour' WHERE refund_id = $1`, [
      refundId,
    ]),
  );
  expect({ refundId, aged: n }).toEqual({ refundId, aged: 1 });
}

/**
 * Ends the lock of a running request's record now, as if its holder had
 * died: the next request with the key and body takes it over. Fails unless
 * the record is running.
 */
export async function expireLock(db: DataSource, operation: string): Promise<void> {
  const n = affected(
    await db.query(
      `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = $1 AND state = 'running'`,
      [operation],
    ),
  );
  expect({ operation, expired: n }).toEqual({ operation, expired: 1 });
}

/** Deletes the operation's record, as the sweep does once it expired. Fails unless there was one. */
export async function forgetRecord(db: DataSource, operation: string): Promise<void> {
  const n = affected(await db.query(`DELETE FROM idempotency_keys WHERE key = $1`, [operation]));
  expect({ operation, forgotten: n }).toEqual({ operation, forgotten: 1 });
}

/** The paying POSTs the fake provider received for `reference`, whatever became of them. */
export const payoutPostsFor = (fake: FakePaymentsServer, reference: string): FakeRequest[] =>
  fake.payoutRequests().filter((r) => (r.body as { reference?: string } | undefined)?.reference === reference);

/** The lookups (`GET /payouts?reference=`) the fake provider received for `reference`. */
export const lookupsFor = (fake: FakePaymentsServer, reference: string): FakeRequest[] =>
  fake.lookupRequests().filter((r) => new URL(r.path, 'http://fake').searchParams.get('reference') === reference);

/** A signal no one aborts. */
export const live = (): AbortSignal => new AbortController().signal;

/** What `call` rejects with, which must be a PaymentOutcomeUnknownError. */
export async function outcomeUnknown(call: Promise<unknown>): Promise<PaymentOutcomeUnknownError> {
  const err: unknown = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PaymentOutcomeUnknownError);
  return err as PaymentOutcomeUnknownError;
}
