import { IsEmail, IsString, Length, Matches, MaxLength } from 'class-validator';

export class CreateSummaryDto {
  @IsString()
  @Length(1, 100_000)
  @Matches(/\S/, { message: 'text must not be only whitespace' })
  text!: string;

  @IsString()
  @MaxLength(254)
  @IsEmail({}, { message: 'notify must be an email address' })
  notify!: string;
}
