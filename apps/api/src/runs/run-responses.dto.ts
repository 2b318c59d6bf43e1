import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';

/** OpenAPI shapes of the answers; the handlers return plain objects of these shapes. */
export class RunAcceptedDto {
  @ApiProperty({ format: 'uuid', description: 'UUIDv5 of tenant, method, path and Idempotency-Key' })
  run_id!: string;

  @ApiProperty({ enum: ['queued'] })
  status!: 'queued';
}

export class RunStepDto {
  @ApiProperty({ example: 'classify' })
  name!: string;

  @ApiProperty({ enum: ['pending', 'running', 'done', 'failed'] })
  status!: 'pending' | 'running' | 'done' | 'failed';

  @ApiProperty({ description: 'Deliveries that began the step; 0 while pending' })
  attempts!: number;

  @ApiPropertyOptional({ description: "The step's committed output", type: 'object', additionalProperties: true })
  output?: unknown;
}

export class RunStatusDto {
  @ApiProperty({ format: 'uuid' })
  run_id!: string;

  @ApiProperty({ example: 'triage', description: 'summaries for a summaries job (its job id is the run id)' })
  workflow!: string;

  @ApiProperty({ enum: ['queued', 'running', 'done', 'failed'] })
  status!: 'queued' | 'running' | 'done' | 'failed';

  @ApiProperty({ type: [RunStepDto], description: "In the workflow's order; empty while queued" })
  steps!: RunStepDto[];

  @ApiPropertyOptional({
    description: "When done: the steps' outputs merged in order",
    type: 'object',
    additionalProperties: true,
  })
  output?: unknown;

  @ApiPropertyOptional({ description: 'When failed: why, e.g. llm_client' })
  error?: string;

  @ApiPropertyOptional({
    description:
      "While a step's model call waits for its tenant's token limit (TENANT_TOKEN_LIMITS): the step, and until when",
    type: 'object',
    properties: {
      reason: { type: 'string', enum: ['token_limit'] },
      step: { type: 'string' },
      until: { type: 'string', format: 'date-time' },
    },
  })
  waiting?: { reason: 'token_limit'; step: string; until: string };
}
