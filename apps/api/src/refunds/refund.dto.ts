import { ApiProperty } from '@nestjs/swagger';
import { IsStorableText } from '@app/problem';
import { IsInt, IsString, Length, Matches, Max, Min } from 'class-validator';

export const MAX_REFUND_AMOUNT = 1_000_000_000;

/**
 * A refund an agent asks for. Strict: unknown fields and values of another
 * JSON type (an amount sent as "1250") are a 400; nothing is converted.
 */
export class CreateRefundDto {
  @ApiProperty({ description: 'The support ticket the refund answers', minLength: 1, maxLength: 64, example: 'T-1042' })
  @IsString()
  @Length(1, 64)
  @IsStorableText()
  ticket_id!: string;

  @ApiProperty({ description: 'The order refunded', minLength: 1, maxLength: 64, example: 'ord_7781' })
  @IsString()
  @Length(1, 64)
  @IsStorableText()
  order_id!: string;

  @ApiProperty({
    description: 'Minor units (cents), a whole number',
    minimum: 1,
    maximum: MAX_REFUND_AMOUNT,
    example: 1250,
  })
  @IsInt()
  @Min(1)
  @Max(MAX_REFUND_AMOUNT)
  amount!: number;

  @ApiProperty({ description: 'ISO 4217 code, three capital letters', pattern: '^[A-Z]{3}$', example: 'EUR' })
  @IsString()
  @Matches(/^[A-Z]{3}$/, { message: 'currency must be three capital letters (ISO 4217)' })
  currency!: string;
}

/** A paid refund, as POST answers it (201) and GET reads it. */
export class RefundDto {
  @ApiProperty({
    format: 'uuid',
    description: 'UUIDv5 of tenant, method, path and Idempotency-Key; the payout’s reference at the provider',
  })
  refund_id!: string;

  @ApiProperty()
  ticket_id!: string;

  @ApiProperty()
  order_id!: string;

  @ApiProperty({ description: 'Minor units' })
  amount!: number;

  @ApiProperty({ example: 'EUR' })
  currency!: string;

  @ApiProperty({ description: 'The payment provider’s id of the payout' })
  payout_id!: string;

  @ApiProperty({ enum: ['paid'] })
  status!: 'paid';
}

export class StoredRefundDto extends RefundDto {
  @ApiProperty({ format: 'date-time', description: 'When the refund was recorded' })
  created_at!: string;
}
