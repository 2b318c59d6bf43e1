import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';

/** OpenAPI shapes of the answers; the handlers return plain objects of these shapes. */
export class JobAcceptedDto {
  @ApiProperty({ format: 'uuid', description: 'UUIDv5 of tenant, method, path and Idempotency-Key' })
  job_id!: string;

  @ApiProperty({ enum: ['queued'] })
  status!: 'queued';
}

export class SummaryStatusDto {
  @ApiProperty({ format: 'uuid' })
  job_id!: string;

  @ApiProperty({ enum: ['queued', 'done', 'failed'] })
  status!: 'queued' | 'done' | 'failed';

  @ApiPropertyOptional({ description: 'When done' })
  summary?: string;

  @ApiPropertyOptional({ description: 'When failed: why the job was dead-lettered, e.g. llm_client' })
  error?: string;
}
