import { ApiProperty } from '@nestjs/swagger';
import { IsStorableText } from '@app/problem';
import { IsEmail, IsString, Length, Matches, MaxLength } from 'class-validator';

export class CreateSummaryDto {
  @ApiProperty({
    description: 'The text to summarise',
    minLength: 1,
    maxLength: 100_000,
    example: 'The quick brown fox jumps over the lazy dog.',
  })
  @IsString()
  @Length(1, 100_000)
  @Matches(/\S/, { message: 'text must not be only whitespace' })
  @IsStorableText()
  text!: string;

  @ApiProperty({
    description: 'Who is told when the summary is ready',
    format: 'email',
    maxLength: 254,
    example: 'you@example.com',
  })
  @IsString()
  @MaxLength(254)
  @IsEmail({}, { message: 'notify must be an email address' })
  @IsStorableText()
  notify!: string;
}
