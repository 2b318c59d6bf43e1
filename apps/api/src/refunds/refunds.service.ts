import { HttpStatus, Inject, Injectable, Logger, NotFoundException } from '@nestjs/common';
import {
  IdempotencyKeyReusedException,
  IdempotencyLockLostError,
  IdempotencyOutcomeUnknownException,
  type IdempotencyRequestContext,
  type PendingIdempotencyRecord,
  type RecoveredAnswer,
} from '@app/idempotency';
import { isUuid, uuidV5 } from '@app/jobs';
import { PaymentOutcomeUnknownError, PaymentsProvider, type Payout } from '@app/payments';
import { RefundRepository, type StoredRefund } from '@app/persistence';
import { PROBLEM_TYPE_PREFIX, ProblemException, ProblemTypes } from '@app/problem';
import { DataSource } from 'typeorm';
import type { CreateRefundDto, RefundDto, StoredRefundDto } from './refund.dto';
import { RefundMetrics } from './refund-metrics';
import { REFUNDS_OPTIONS, type RefundsOptions } from './refunds.options';

/** The namespace of refund ids (UUIDv5 of the request's operation: tenant, method, path, key). */
const REFUND_ID_NAMESPACE = '6f2b1c4e-0d7a-4e5b-9c3f-8a1d2e4b6c70';

export const RefundProblemTypes = {
  paymentRefused: `${PROBLEM_TYPE_PREFIX}payment-refused`,
} as const;

/** The refund id of an operation: the same key always names the same refund, and the same payout reference. */
export function refundIdFor(operation: string): string {
  return uuidV5(operation, REFUND_ID_NAMESPACE);
}

export const refundLocation = (refundId: string): string => `/v1/refunds/${refundId}`;

/** A recorded refund as the route answers it. */
export const refundAnswerOf = (r: StoredRefund): RefundDto => ({
  refund_id: r.refundId,
  ticket_id: r.ticketId,
  order_id: r.orderId,
  amount: r.amount,
  currency: r.currency,
  payout_id: r.payoutId,
  status: 'paid',
});

/** The first short text a provider's refusal body gives as its reason, if any. */
function refusalReason(body: unknown): string | undefined {
  if (typeof body === 'string') return body.trim() ? body.trim().slice(0, 200) : undefined;
  if (typeof body !== 'object' || body === null) return undefined;
  const fields = body as Record<string, unknown>;
  for (const name of ['detail', 'title', 'message', 'error', 'type']) {
    const value = fields[name];
    if (typeof value === 'string' && value.trim()) return value.trim().slice(0, 200);
  }
  return undefined;
}

/** The provider said no: nothing was paid. A business answer, stored and replayed like a success. */
export class PaymentRefusedException extends ProblemException {
  constructor(refundId: string, providerStatus: number, body: unknown) {
    const reason = refusalReason(body);
    super({
      type: RefundProblemTypes.paymentRefused,
      title: 'The payment provider refused the refund',
      status: HttpStatus.UNPROCESSABLE_ENTITY,
      detail: `The payment provider refused the payout (${providerStatus}${reason ? `: ${reason}` : ''}). Nothing was paid.`,
      extensions: { refund_id: refundId, provider_status: providerStatus },
    });
  }
}

/**
 * A refund is one payout at the provider and one `refunds` row, whatever
 * happens to the requests that ask for it.
 *
 * - The payout's reference (and its Idempotency-Key at the provider) is the
 *   refund id, a UUIDv5 of the request's operation.
 * - An answer that settles nothing (a timeout, a broken connection, a 5xx)
 *   is an unknown outcome, never a failure: the payout is looked up by
 *   reference at once; found, it is recorded; not found (or the lookup fails
 *   too), the request answers 503 and leaves its key to the next request,
 *   which looks up again (RefundRecovery) before anything is paid again.
 * - The row and the request's stored answer commit in one transaction.
 * - Nothing assumes the provider dedupes.
 */
@Injectable()
export class RefundsService {
  private readonly logger = new Logger(RefundsService.name);
  /**
   * Never aborted: a payout, once sent, is waited for (up to
   * PAYMENTS_TIMEOUT_S) whatever happens to the caller or the process, so an
   * outcome is never made unknown on purpose. A SIGTERM drains requests in
   * flight; a SIGKILL leaves the key to RefundRecovery.
   */
  private readonly signal = new AbortController().signal;

  constructor(
    @Inject(PaymentsProvider) private readonly provider: PaymentsProvider,
    @Inject(REFUNDS_OPTIONS) private readonly options: RefundsOptions,
    private readonly dataSource: DataSource,
    private readonly refunds: RefundRepository,
    private readonly metrics: RefundMetrics,
  ) {}

  /** POST /v1/refunds, run under the request's claimed key. */
  async refund(context: IdempotencyRequestContext, body: CreateRefundDto, record: PendingIdempotencyRecord): Promise<RefundDto> {
    const refundId = refundIdFor(context.operation);
    // A refund recorded long ago, whose stored answer has expired: it is
    // the answer; paying again with the same reference is never right.
    const known = await this.known(refundId);
    if (known) return this.answerFrom(known, body);
    const payout = await this.pay(refundId, body);
    return this.record(context.scope, refundId, body, payout, record);
  }

  /**
   * What a request that died holding the key did (RefundRecovery): its row,
   * else its payout at the provider, recorded now with the answer. Undefined:
   * the provider knows no payout with the reference, so the handler runs
   * (and pays, with the same reference). Throws while it cannot be known.
   */
  async recover(context: IdempotencyRequestContext, body: CreateRefundDto, record: PendingIdempotencyRecord): Promise<RecoveredAnswer | undefined> {
    const refundId = refundIdFor(context.operation);
    const known = await this.known(refundId);
    if (known) return this.created(this.answerFrom(known, body));
    const payout = await this.lookUp(refundId);
    if (!payout) return undefined;
    this.metrics.refund('found');
    this.logger.log(`refund ${refundId}: a request died after its payout ${payout.payout_id}; recorded from the provider's lookup`);
    return this.created(await this.record(context.scope, refundId, body, payout, record));
  }

  /** GET /v1/refunds/<id>: the tenant's own refund; any other id is not found. */
  async find(refundId: string, tenant: string): Promise<StoredRefundDto> {
    if (!isUuid(refundId)) throw notFound();
    let stored: StoredRefund | undefined;
    try {
      stored = await this.refunds.findForTenant(this.dataSource.manager, refundId.toLowerCase(), tenant);
    } catch (err) {
      this.logger.warn(`refund ${refundId} could not be read: ${(err as Error).message}`);
      throw unavailable('The refund cannot be read right now');
    }
    if (!stored) throw notFound();
    return { ...refundAnswerOf(stored), created_at: stored.createdAt.toISOString() };
  }

  /** The recorded refund with this id. Unreadable: a 503 before anything is sent to the provider (the key is freed). */
  private async known(refundId: string): Promise<StoredRefund | undefined> {
    try {
      return await this.refunds.find(this.dataSource.manager, refundId);
    } catch (err) {
      this.logger.warn(`refund ${refundId} could not be read: ${(err as Error)?.message ?? String(err)}`);
      throw unavailable('Refunds cannot be made right now; nothing was paid');
    }
  }

  private created(answer: RefundDto): RecoveredAnswer {
    return { status: HttpStatus.CREATED, body: answer, headers: { location: refundLocation(answer.refund_id) } };
  }

  /** A recorded refund answers a request only if it is that request's refund: the same key with another body is a 422. */
  private answerFrom(known: StoredRefund, body: CreateRefundDto): RefundDto {
    const same = known.ticketId === body.ticket_id && known.orderId === body.order_id && known.amount === body.amount && known.currency === body.currency;
    if (!same) throw new IdempotencyKeyReusedException();
    return refundAnswerOf(known);
  }

  /** One payout attempt: the payout, or a thrown refusal (422) or unknown outcome (503). */
  private async pay(refundId: string, body: CreateRefundDto): Promise<Payout> {
    const request = { reference: refundId, order_id: body.order_id, amount: body.amount, currency: body.currency };
    let result;
    try {
      result = await this.provider.payout(request, this.signal);
    } catch (err) {
      // Whatever went wrong, the request may have reached the provider.
      this.metrics.payout('unknown');
      const why = err instanceof PaymentOutcomeUnknownError ? err.message : `the call failed: ${(err as Error)?.message ?? String(err)}`;
      this.logger.warn(`refund ${refundId}: payout outcome unknown (${why}); looking it up`);
      const found = await this.lookUp(refundId);
      if (found) {
        this.metrics.refund('found');
        return found;
      }
      this.metrics.refund('unknown');
      // After a timeout our request may still be running at the provider:
      // the next attempt should come after another full timeout, when a
      // payout still absent is absent for good.
      const timedOut = err instanceof PaymentOutcomeUnknownError && err.reason === 'timeout';
      throw new IdempotencyOutcomeUnknownException(
        `The payment provider did not settle the payout (${why}) and has no payout with this refund's reference yet. ` +
          'Retry with the same Idempotency-Key: the refund is looked up again before anything is paid.',
        timedOut ? Math.ceil(this.options.paymentsTimeoutMs / 1000) : 1,
      );
    }
    if (result.outcome === 'refused') {
      this.metrics.payout('refused');
      this.metrics.refund('refused');
      throw new PaymentRefusedException(refundId, result.status, result.body);
    }
    this.metrics.payout('paid');
    this.metrics.refund('paid');
    return result.payout;
  }

  /** The payout with the refund's reference, none (known absent), or a thrown unknown outcome. */
  private async lookUp(refundId: string): Promise<Payout | undefined> {
    try {
      const payout = await this.provider.lookup(refundId, this.signal);
      this.metrics.lookup(payout ? 'found' : 'absent');
      return payout;
    } catch (err) {
      this.metrics.lookup('unknown');
      this.metrics.refund('unknown');
      this.logger.warn(`refund ${refundId}: lookup failed: ${(err as Error)?.message ?? String(err)}`);
      throw new IdempotencyOutcomeUnknownException(
        'The payment provider cannot say yet whether this refund was paid. Retry with the same Idempotency-Key: nothing is paid again before it can.',
      );
    }
  }

  /** The refund's row and the request's stored answer, in one transaction. */
  private async record(tenant: string, refundId: string, body: CreateRefundDto, payout: Payout, record: PendingIdempotencyRecord): Promise<RefundDto> {
    try {
      return await this.dataSource.transaction(async (em) => {
        const stored = await this.refunds.record(em, {
          refundId,
          tenant,
          ticketId: body.ticket_id,
          orderId: body.order_id,
          amount: body.amount,
          currency: body.currency,
          payoutId: payout.payout_id,
        });
        const answer = this.answerFrom(stored, body);
        await record.completeWithin(em, { status: HttpStatus.CREATED, body: answer, headers: { location: refundLocation(refundId) } });
        return answer;
      });
    } catch (err) {
      if (err instanceof IdempotencyKeyReusedException) throw err;
      // Paid, but not recorded: the next request with the key finds the payout by lookup and records it.
      const why = err instanceof IdempotencyLockLostError ? 'another request holds the key now' : (err as Error)?.message ?? String(err);
      this.logger.error(`refund ${refundId}: payout ${payout.payout_id} made but not recorded (${why})`);
      throw new IdempotencyOutcomeUnknownException('The refund was paid but could not be recorded yet. Retry with the same Idempotency-Key to get it.');
    }
  }
}

function notFound(): NotFoundException {
  return new NotFoundException('No such refund.');
}

function unavailable(title: string): ProblemException {
  return new ProblemException({ type: ProblemTypes.serviceUnavailable, title, status: HttpStatus.SERVICE_UNAVAILABLE, headers: { 'Retry-After': '1' } });
}
