import { ApiProperty } from '@nestjs/swagger';
import { IsStorableText } from '@app/problem';
import { IsEmail, IsString, Length, Matches, MaxLength } from 'class-validator';

/** The triage workflow's input, as it is queued (the worker's TriageWorkflow validates the same fields). */
export class CreateTriageDto {
  @ApiProperty({ description: 'The ticket this triage is for', minLength: 1, maxLength: 64, example: 'T-1042' })
  @IsString()
  @Length(1, 64)
  @Matches(/\S/, { message: 'ticket_id must not be only whitespace' })
  @IsStorableText()
  ticket_id!: string;

  @ApiProperty({
    description: "The ticket's text",
    minLength: 1,
    maxLength: 100_000,
    example: 'My order arrived broken and I would like a replacement.',
  })
  @IsString()
  @Length(1, 100_000)
  @Matches(/\S/, { message: 'text must not be only whitespace' })
  @IsStorableText()
  text!: string;

  @ApiProperty({
    description: 'Who is told when the triage is ready',
    format: 'email',
    maxLength: 254,
    example: 'support@example.com',
  })
  @IsString()
  @MaxLength(254)
  @IsEmail({}, { message: 'notify must be an email address' })
  @IsStorableText()
  notify!: string;
}
