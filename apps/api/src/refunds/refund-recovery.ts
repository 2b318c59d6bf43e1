import { Injectable } from '@nestjs/common';
import type {
  IdempotencyRecovery,
  IdempotencyRequestContext,
  PendingIdempotencyRecord,
  RecoveredAnswer,
} from '@app/idempotency';
import { RequestValidationPipe } from '@app/problem';
import type { Request } from 'express';
import { CreateRefundDto } from './refund.dto';
import { RefundsService } from './refunds.service';

/**
 * Runs before a request re-runs a refund key whose earlier request died
 * holding it (a SIGKILL between the provider's answer and the commit, a
 * timeout whose lookup found nothing yet): what did that request pay?
 * It runs before the route's pipes, so it validates the body itself; an
 * invalid body did nothing, and the pipes answer it with a 400.
 */
@Injectable()
export class RefundRecovery implements IdempotencyRecovery {
  private readonly validation = new RequestValidationPipe();

  constructor(private readonly refunds: RefundsService) {}

  async recover(
    context: IdempotencyRequestContext,
    request: Request,
    pending: PendingIdempotencyRecord,
  ): Promise<RecoveredAnswer | undefined> {
    let body: CreateRefundDto;
    try {
      body = (await this.validation.transform(request.body, {
        type: 'body',
        metatype: CreateRefundDto,
      })) as CreateRefundDto;
    } catch {
      return undefined;
    }
    return this.refunds.recover(context, body, pending, request);
  }
}
