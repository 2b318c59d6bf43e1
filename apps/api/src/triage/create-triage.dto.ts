import { ApiProperty, IntersectionType, PickType } from '@nestjs/swagger';
import { IsStorableText } from '@app/problem';
import { IsString, Length, Matches } from 'class-validator';
import { CreateSummaryDto } from '../summaries/create-summary.dto';

class TriageTicketDto {
  @ApiProperty({ description: 'The ticket this triage is for', minLength: 1, maxLength: 64, example: 'T-1042' })
  @IsString()
  @Length(1, 64)
  @Matches(/\S/, { message: 'ticket_id must not be only whitespace' })
  @IsStorableText()
  ticket_id!: string;
}

/**
 * The triage workflow's input, as it is queued (the worker's TriageWorkflow
 * validates the same fields). `text` and `notify` take their rules from
 * POST /v1/summaries' body, so the two routes cannot come to accept different
 * texts or addresses; only their descriptions are triage's own.
 */
export class CreateTriageDto extends IntersectionType(TriageTicketDto, PickType(CreateSummaryDto, ['text', 'notify'])) {
  @ApiProperty({ description: "The ticket's text", example: 'My order arrived broken and I would like a replacement.' })
  declare text: string;

  @ApiProperty({ description: 'Who is told when the triage is ready', example: 'support@example.com' })
  declare notify: string;
}
