import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Req, Res, UseGuards } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import {
  IdempotencyContext,
  IdempotencyRecord,
  Idempotent,
  type IdempotencyRequestContext,
  type PendingIdempotencyRecord,
} from '@app/idempotency';
import { ApiProblemResponse, type ProblemDocument } from '@app/problem';
import type { Request, Response } from 'express';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { Tenant } from '../auth/principal';
import { TENANT_KEY_AUTH } from '../openapi';
import { CreateRefundDto, RefundDto, StoredRefundDto } from './refund.dto';
import { RefundRecovery } from './refund-recovery';
import { RefundsService } from './refunds.service';

@ApiTags('refunds')
@ApiBearerAuth(TENANT_KEY_AUTH)
@ApiProblemResponse(401, 'No or unknown API key')
@Controller('v1/refunds')
@UseGuards(ApiKeyGuard)
export class RefundsController {
  constructor(private readonly refunds: RefundsService) {}

  /**
   * Refunds an order: one payout at the payment provider, whatever the
   * retries. The key table is PostgreSQL's whatever IDEMPOTENCY_STORE says,
   * so the refund's row and its stored answer commit together.
   */
  @Post()
  @Idempotent({ store: 'postgres', recover: RefundRecovery })
  @HttpCode(HttpStatus.CREATED)
  @ApiCreatedResponse({
    type: RefundDto,
    description: 'Paid; Location names the refund. A replay carries Idempotent-Replayed: true.',
  })
  @ApiProblemResponse(
    422,
    'The payment provider refused the payout (type …payment-refused; stored and replayed), or the key was used with another body.',
  )
  @ApiProblemResponse(
    503,
    'The payout’s outcome is not known yet (type …outcome-unknown): retry with the same key after Retry-After; nothing is paid twice.',
  )
  @ApiProblemResponse(413, 'The body is over 1 MiB. Nothing was done.')
  async create(
    @Body() body: CreateRefundDto,
    @IdempotencyContext() idempotency: IdempotencyRequestContext,
    @IdempotencyRecord() pending: PendingIdempotencyRecord,
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
  ): Promise<RefundDto | ProblemDocument> {
    const result = await this.refunds.refund(idempotency, body, pending, req);
    // Refused: the interceptor sends the 422 stored with the refusal, not this body.
    if ('refused' in result) return result.refused;
    res.location(`/v1/refunds/${result.paid.refund_id}`);
    return result.paid;
  }

  /** The tenant's own refund; 404 for any other id. */
  @Get(':refundId')
  @ApiOkResponse({ type: StoredRefundDto })
  @ApiProblemResponse(404, 'No such refund for this tenant')
  read(@Param('refundId') refundId: string, @Tenant() tenant: string): Promise<StoredRefundDto> {
    return this.refunds.find(refundId, tenant);
  }
}
