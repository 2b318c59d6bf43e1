import { HttpStatus, Inject, Injectable, Logger, NotFoundException } from '@nestjs/common';
import {
  IdempotencyKeyReusedException,
  IdempotencyLockLostError,
  IdempotencyOutcomeUnknownException,
  type IdempotencyRequestContext,
  type PendingIdempotencyRecord,
  type RecoveredAnswer,
} from '@app/idempotency';
import { isUuid, uuidV5 } from '@app/ids';
import { PaymentOutcomeUnknownError, PaymentsProvider, type Payout } from '@app/payments';
import {
  type RefundFacts,
  RefundRepository,
  type RefundState,
  type SendClaim,
  type StoredRefund,
} from '@app/persistence';
import {
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_PREFIX,
  type ProblemDocument,
  ProblemException,
  serviceUnavailable,
} from '@app/problem';
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

/** The mark a refusal would settle belongs to a later send (its `sends` moved on): the refusal settles nothing. */
class RefusalSupersededError extends Error {
  constructor() {
    super('a later payout was sent after the refused one');
  }
}

/**
 * What a refund request comes to: paid, or refused with the refusal already
 * stored as the key's answer (the interceptor sends what was stored).
 */
export type RefundResult = { readonly paid: RefundDto } | { readonly refused: ProblemDocument };

/** A payout sent and settled (paid or refused), or one only a lookup found. */
type PayResult =
  | { readonly how: 'paid' | 'found'; readonly payout: Payout }
  | { readonly how: 'refused'; readonly refusal: PaymentRefusedException; readonly sends: number };

/**
 * A refund is one payout at the provider and one `refunds` row, whatever
 * happens to the requests that ask for it.
 *
 * - The payout's reference (and its Idempotency-Key at the provider) is the
 *   refund id, a UUIDv5 of the request's operation.
 * - Before a payout leaves, a `refund_attempts` row says so (committed
 *   first). While it stands, the refund's outcome may be anything: every
 *   later request for the refund looks the payout up before it pays, however
 *   late it comes, and none sends another within `resendAfterMs` of the last
 *   send (two PAYMENTS_TIMEOUT_S: one for our request, one for the
 *   provider to finish one we gave up on). The row goes when the refund is
 *   recorded, or with the stored refusal of its last send (nothing was
 *   paid). Never on a time limit: a send whose answer was lost (a crash, a
 *   timeout) may have paid, and only a lookup settles it.
 * - An answer that settles nothing (a timeout, a broken connection, a 5xx)
 *   is an unknown outcome, never a failure: the payout is looked up at once;
 *   found, it is recorded; otherwise the request answers 503 and abandons its
 *   key, and the next request with it (RefundRecovery) looks up again.
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
  /** Requests whose recovery already asked the provider and heard "none": the handler pays without asking again. */
  private readonly lookedUpAbsent = new WeakSet<object>();
  private readonly resendAfterMs: number;

  constructor(
    @Inject(PaymentsProvider) private readonly provider: PaymentsProvider,
    @Inject(REFUNDS_OPTIONS) options: RefundsOptions,
    private readonly dataSource: DataSource,
    private readonly rows: RefundRepository,
    private readonly metrics: RefundMetrics,
  ) {
    this.resendAfterMs = 2 * options.paymentsTimeoutMs;
  }

  /**
   * POST /v1/refunds, run under the request's claimed key. `context.scope`
   * is the tenant (the api scopes keys by tenant).
   */
  async refund(
    context: IdempotencyRequestContext,
    body: CreateRefundDto,
    pending: PendingIdempotencyRecord,
    request: object,
  ): Promise<RefundResult> {
    const facts = factsOf(context, body);
    const state = await this.stateOf(facts.refundId);
    // Recorded already (the key's stored answer may have expired): that is the answer.
    if (state.paid) return { paid: this.answerFrom(state.paid, body) };
    if (state.attempt) {
      assertSameRefund(state.attempt, body);
      if (!this.lookedUpAbsent.has(request)) {
        const found = await this.lookUp(facts.refundId);
        if (found) return { paid: await this.recordFound(facts, found, pending) };
      }
    }
    const payout = await this.pay(facts);
    if (payout.how === 'refused') return { refused: await this.recordRefusal(facts, payout, pending) };
    if (payout.how === 'found') return { paid: await this.recordFound(facts, payout.payout, pending) };
    const answer = await this.record(facts, payout.payout, pending);
    this.metrics.refund('paid');
    return { paid: answer };
  }

  /**
   * What a request that died holding the key did (RefundRecovery): its row;
   * nothing, when no payout was ever sent for it; else its payout at the
   * provider, recorded now with the answer. Undefined: the handler runs (and
   * pays, with the same reference). Throws while it cannot be known.
   */
  async recover(
    context: IdempotencyRequestContext,
    body: CreateRefundDto,
    pending: PendingIdempotencyRecord,
    request: object,
  ): Promise<RecoveredAnswer | undefined> {
    const facts = factsOf(context, body);
    const state = await this.stateOf(facts.refundId);
    if (state.paid) return this.created(this.answerFrom(state.paid, body));
    if (!state.attempt) return undefined;
    assertSameRefund(state.attempt, body);
    const found = await this.lookUp(facts.refundId);
    if (!found) {
      this.lookedUpAbsent.add(request);
      return undefined;
    }
    this.logger.log(
      `refund ${facts.refundId}: a request died after sending its payout; payout ${found.payout_id} found by lookup`,
    );
    return this.created(await this.recordFound(facts, found, pending));
  }

  /** GET /v1/refunds/<id>: the tenant's own refund; any other id is not found. */
  async find(refundId: string, tenant: string): Promise<StoredRefundDto> {
    if (!isUuid(refundId)) throw notFound();
    let stored: StoredRefund | undefined;
    try {
      stored = await this.rows.findForTenant(this.dataSource.manager, refundId.toLowerCase(), tenant);
    } catch (err) {
      this.logger.warn(`refund ${refundId} could not be read: ${errorText(err)}`);
      throw unavailable('The refund cannot be read right now');
    }
    if (!stored) throw notFound();
    return { ...refundAnswerOf(stored), created_at: stored.createdAt.toISOString() };
  }

  /** The refund's row and unsettled attempt. Unreadable: a 503 before anything is sent (the key is freed). */
  private async stateOf(refundId: string): Promise<RefundState> {
    try {
      return await this.rows.state(this.dataSource.manager, refundId);
    } catch (err) {
      this.logger.warn(`refund ${refundId} could not be read: ${errorText(err)}`);
      throw unavailable('Refunds cannot be made right now; nothing was paid');
    }
  }

  private created(answer: RefundDto): RecoveredAnswer {
    return { status: HttpStatus.CREATED, body: answer, headers: { location: refundLocation(answer.refund_id) } };
  }

  /**
   * A recorded refund answers a request only if it is that request's refund: the same key with another body is a
   * 422.
   */
  private answerFrom(known: StoredRefund, body: CreateRefundDto): RefundDto {
    assertSameRefund(known, body);
    return refundAnswerOf(known);
  }

  /**
   * One payout: sent (and settled: paid, or a thrown refusal), or found by
   * the lookup that follows an answer settling nothing, or a thrown unknown
   * outcome (503). Nothing is sent while an earlier send may be in flight.
   */
  private async pay(facts: RefundFacts): Promise<PayResult> {
    const claim = await this.claimSend(facts);
    if (!claim.sent) {
      this.metrics.refund('unknown');
      throw new IdempotencyOutcomeUnknownException(
        'A payout for this refund was sent moments ago and may still be settling. Retry with the same Idempotency-Key after Retry-After: it is looked up before anything is paid.',
        Math.max(1, Math.ceil(claim.waitMs / 1000)),
      );
    }
    const request = {
      reference: facts.refundId,
      order_id: facts.orderId,
      amount: facts.amount,
      currency: facts.currency,
    };
    let result;
    try {
      result = await this.provider.payout(request, this.signal);
    } catch (err) {
      // Whatever went wrong, the request may have reached the provider.
      this.metrics.payout('unknown');
      const why = err instanceof PaymentOutcomeUnknownError ? err.message : `the call failed: ${errorText(err)}`;
      this.logger.warn(`refund ${facts.refundId}: payout outcome unknown (${why}); looking it up`);
      const found = await this.lookUp(facts.refundId);
      if (found) return { how: 'found', payout: found };
      this.metrics.refund('unknown');
      throw new IdempotencyOutcomeUnknownException(
        `The payment provider did not settle the payout (${why}) and has no payout with this refund's reference yet. ` +
          'Retry with the same Idempotency-Key after Retry-After: the refund is looked up again before anything is paid.',
        Math.ceil(this.resendAfterMs / 1000),
      );
    }
    if (result.outcome === 'refused') {
      this.metrics.payout('refused');
      this.metrics.refund('refused');
      const refusal = new PaymentRefusedException(facts.refundId, result.status, result.body);
      return { how: 'refused', refusal, sends: claim.sends };
    }
    this.metrics.payout('paid');
    return { how: 'paid', payout: result.payout };
  }

  /**
   * The send mark, committed before the payout leaves. Unwritable: a 503 before anything is sent (the key is
   * freed).
   */
  private async claimSend(facts: RefundFacts): Promise<SendClaim> {
    try {
      return await this.rows.claimSend(this.dataSource.manager, facts, this.resendAfterMs);
    } catch (err) {
      this.logger.warn(`refund ${facts.refundId}: could not mark the payout before sending it: ${errorText(err)}`);
      throw unavailable('Refunds cannot be made right now; nothing was paid');
    }
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
      this.logger.warn(`refund ${refundId}: lookup failed: ${errorText(err)}`);
      throw new IdempotencyOutcomeUnknownException(
        'The payment provider cannot say yet whether this refund was paid. Retry with the same Idempotency-Key: nothing is paid again before it can.',
      );
    }
  }

  /** A payout only a lookup settled, recorded. */
  private async recordFound(facts: RefundFacts, payout: Payout, pending: PendingIdempotencyRecord): Promise<RefundDto> {
    const answer = await this.record(facts, payout, pending);
    this.metrics.refund('found');
    return answer;
  }

  /**
   * The refusal stored as the key's answer and the send mark it settles
   * removed, in one transaction: a refused refund leaves no mark behind, and
   * a mark never goes without its refusal stored. Not stored (another
   * request holds the key now, the database failed): the refusal is thrown
   * for the interceptor to store or release, and the mark stays for the
   * next request to look up, which finds nothing and sends again. A later
   * send since (the mark's `sends` moved on): nothing is stored, the mark
   * stays, and the outcome is unknown (503, the key abandoned).
   */
  private async recordRefusal(
    facts: RefundFacts,
    refused: Extract<PayResult, { how: 'refused' }>,
    pending: PendingIdempotencyRecord,
  ): Promise<ProblemDocument> {
    const { refusal } = refused;
    try {
      await this.dataSource.transaction(async (em) => {
        if (!(await this.rows.settleRefused(em, facts.refundId, refused.sends))) throw new RefusalSupersededError();
        await pending.completeWithin(em, {
          status: refusal.getStatus(),
          body: refusal.problem,
          headers: { ...refusal.headers, 'content-type': PROBLEM_CONTENT_TYPE },
        });
      });
    } catch (err) {
      if (err instanceof RefusalSupersededError) {
        // Another payout with the reference left after this one (a takeover once the resend window passed): the
        // refund is what that one does, which nobody knows yet. The key is abandoned, so its next request looks up.
        this.logger.warn(`refund ${facts.refundId}: payout refused, but a later one was sent; its outcome is unknown`);
        this.metrics.refund('unknown');
        throw new IdempotencyOutcomeUnknownException(
          'The payment provider refused this payout, but another payout for the refund was sent since and its outcome is not known yet. Retry with the same Idempotency-Key: nothing is paid again before it is known.',
          Math.ceil(this.resendAfterMs / 1000),
        );
      }
      const why = err instanceof IdempotencyLockLostError ? 'another request holds the key now' : errorText(err);
      this.logger.warn(`refund ${facts.refundId}: payout refused, refusal not stored with its mark (${why})`);
      throw refusal;
    }
    return refusal.problem;
  }

  /** The refund's row and the request's stored answer, in one transaction. */
  private async record(facts: RefundFacts, payout: Payout, pending: PendingIdempotencyRecord): Promise<RefundDto> {
    try {
      return await this.dataSource.transaction(async (em) => {
        const stored = await this.rows.record(em, { ...facts, payoutId: payout.payout_id });
        const answer = refundAnswerOf(stored);
        await pending.completeWithin(em, {
          status: HttpStatus.CREATED,
          body: answer,
          headers: { location: refundLocation(facts.refundId) },
        });
        return answer;
      });
    } catch (err) {
      // Paid, but not recorded: its send mark stays, so the next request with the key finds the payout by lookup and
      // records it.
      const why = err instanceof IdempotencyLockLostError ? 'another request holds the key now' : errorText(err);
      this.logger.error(`refund ${facts.refundId}: payout ${payout.payout_id} made but not recorded (${why})`);
      this.metrics.refund('unknown');
      throw new IdempotencyOutcomeUnknownException(
        'The refund was paid but could not be recorded yet. Retry with the same Idempotency-Key to get it.',
      );
    }
  }
}

/** The refund a request asks for, under its refund id. */
function factsOf(context: IdempotencyRequestContext, body: CreateRefundDto): RefundFacts {
  return {
    refundId: refundIdFor(context.operation),
    tenant: context.scope,
    ticketId: body.ticket_id,
    orderId: body.order_id,
    amount: body.amount,
    currency: body.currency,
  };
}

/** The same refund id with other facts is the key reused for another refund: a 422, never a payout. */
function assertSameRefund(
  known: Pick<RefundFacts, 'ticketId' | 'orderId' | 'amount' | 'currency'>,
  body: CreateRefundDto,
): void {
  const same =
    known.ticketId === body.ticket_id &&
    known.orderId === body.order_id &&
    known.amount === body.amount &&
    known.currency === body.currency;
  if (!same) throw new IdempotencyKeyReusedException();
}

const errorText = (err: unknown): string =>
  err instanceof Error ? err.message : String((err as { message?: unknown })?.message ?? err);

function notFound(): NotFoundException {
  return new NotFoundException('No such refund.');
}

const unavailable = (title: string): ProblemException => serviceUnavailable(title);
