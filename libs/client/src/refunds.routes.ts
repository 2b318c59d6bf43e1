import type { ApiClient, CallOptions } from './api-client';
import type { ApiResult } from './api-result';
import { idempotencyKey } from './idempotency-key';

export interface RefundRequest {
  /** The support ticket asking for the refund, 1..64 characters. */
  readonly ticket_id: string;
  /** 1..64 characters. */
  readonly order_id: string;
  /** Minor units (cents), an integer 1..1000000000. */
  readonly amount: number;
  /** Three capital letters, e.g. `EUR`. */
  readonly currency: string;
}

/** `201` of POST /v1/refunds, and `200` of GET /v1/refunds/<refund_id>. */
export interface Refund {
  readonly refund_id: string;
  readonly ticket_id: string;
  readonly order_id: string;
  readonly amount: number;
  readonly currency: string;
  readonly payout_id: string;
  readonly status: 'paid';
  /** When the refund was recorded (ISO 8601): in GET's answer only. */
  readonly created_at?: string;
}

/**
 * The key of a refund: one per (ticket, order). A re-run of the same agent turn
 * or a retry rebuilds the same key (one payout); another ticket for the same
 * order is another key (a second, legitimate refund). The amount is left out
 * on purpose: the same ticket and order with another amount is a 422 (a
 * mistake to surface), not a second refund.
 */
export function refundKey(request: Pick<RefundRequest, 'ticket_id' | 'order_id'>): string {
  return idempotencyKey('refund', request.ticket_id, request.order_id);
}

/**
 * POST /v1/refunds under `refundKey(request)`. `rejected` 422 is a refusal
 * (the provider's, problem type ending in `payment-refused`, or the key reused
 * with another body); `unknown` means the refund may or may not have been paid:
 * call this again later with the same request (same key), or look it up; never
 * issue it under another key.
 */
export function issueRefund(
  client: ApiClient,
  request: RefundRequest,
  options: CallOptions = {},
): Promise<ApiResult<Refund>> {
  const body: RefundRequest = {
    ticket_id: request.ticket_id,
    order_id: request.order_id,
    amount: request.amount,
    currency: request.currency,
  };
  return client.post<Refund>('/v1/refunds', body, { ...options, key: refundKey(request) });
}

/** GET /v1/refunds/<refund_id>: `rejected` with 404 for a refund of another tenant or none. */
export function getRefund(client: ApiClient, refundId: string, options: CallOptions = {}): Promise<ApiResult<Refund>> {
  return client.get<Refund>(`/v1/refunds/${encodeURIComponent(refundId)}`, options);
}
