import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';

/* The admin answers, for the OpenAPI document. */

export class PartitionFiguresDto {
  @ApiProperty({ description: 'The partition, 0 to JOB_STREAM_PARTITIONS - 1' })
  partition!: number;
  @ApiProperty({ description: "Entries in the partition's job stream not yet acknowledged" })
  length!: number;
  @ApiProperty({ description: 'Of those, delivered to a worker and not yet acknowledged' })
  pending!: number;
  @ApiProperty({ description: "Entries in the partition's dead-letter stream" })
  deadLetters!: number;
}

export class QueueFiguresDto {
  @ApiProperty({ description: 'Entries not yet acknowledged, all partitions ({summaries}:jobs with one)' })
  length!: number;
  @ApiProperty({ description: 'Of those, delivered to a worker and not yet acknowledged' })
  pending!: number;
  @ApiProperty({ description: 'Dead letters, all partitions ({summaries}:dead with one)' })
  deadLetters!: number;
  @ApiProperty({ type: [PartitionFiguresDto], description: 'The same, partition by partition' })
  partitions!: PartitionFiguresDto[];
}

export class NamedQueueFiguresDto extends QueueFiguresDto {
  @ApiProperty({ description: 'The queue: summaries, workflows' })
  name!: string;
  @ApiProperty({ description: 'Its consumer group' })
  group!: string;
}

export class WorkflowFiguresDto {
  @ApiProperty()
  name!: string;
  @ApiProperty({ description: 'Its dead letters, in whichever queue' })
  deadLetters!: number;
  @ApiProperty({ description: 'Its failed runs still kept (WORKFLOW_RUN_RETENTION_DAYS)' })
  failedRuns!: number;
}

export class OutboxFiguresDto {
  @ApiProperty({ description: 'Unsent rows still being tried' })
  backlog!: number;
  @ApiProperty({ description: 'Age of the oldest of them, in seconds (0 when there is none)' })
  oldestUnsentAgeSeconds!: number;
  @ApiProperty({ description: 'Rows that ran out of attempts and wait for a person' })
  parked!: number;
}

export class SystemFiguresDto {
  @ApiProperty({ type: QueueFiguresDto })
  queue!: QueueFiguresDto;
  @ApiProperty({ type: OutboxFiguresDto })
  outbox!: OutboxFiguresDto;
  @ApiProperty({ type: [NamedQueueFiguresDto], description: 'Every queue, summaries included' })
  queues!: NamedQueueFiguresDto[];
  @ApiPropertyOptional({ type: WorkflowFiguresDto, description: 'With ?workflow=: that workflow' })
  workflow?: WorkflowFiguresDto;
}

export class DeadLetterDto {
  @ApiProperty({
    description:
      'What a re-drive names: the dead-letter entry id, <ms>-<seq>, with one partition; ' +
      '<partition>:<ms>-<seq> with JOB_STREAM_PARTITIONS above 1; prefixed with <queue>/ for a queue other than ' +
      'summaries (workflows/1764460800000-0)',
    example: '1764460800000-0',
  })
  id!: string;
  @ApiProperty({ description: 'The queue it was dead-lettered in: summaries, workflows' })
  queue!: string;
  @ApiProperty({ description: 'The job stream partition it was dead-lettered in (0 with one partition)' })
  partition!: number;
  @ApiProperty({
    description:
      "Its workflow field, else its queue's own workflow (summaries), else its queue's name (a record of the " +
      'shared queue recorded by id only, deleted_from_stream, names no workflow: workflows)',
  })
  workflow!: string;
  @ApiPropertyOptional({ description: "The step that failed; absent: the workflow's first step" })
  step?: string;
  @ApiPropertyOptional({ description: 'The job stream entry it came from' })
  sourceId?: string;
  @ApiPropertyOptional({ description: 'Why, e.g. llm_client, max_deliveries, deleted_from_stream' })
  reason?: string;
  @ApiPropertyOptional({ description: 'The last error, in a line' })
  detail?: string;
  @ApiPropertyOptional({ format: 'uuid', description: 'The job id; for a workflow step, its run id' })
  jobId?: string;
  @ApiPropertyOptional()
  tenant?: string;
  @ApiProperty({ type: String, format: 'date-time' })
  deadLetteredAt!: Date;
}

export class DeadLetterDetailDto extends DeadLetterDto {
  @ApiProperty({
    type: 'object',
    additionalProperties: { type: 'string' },
    description: 'Every field of the entry as stored (payload, state, ... and reason, detail, source_id)',
  })
  fields!: Record<string, string>;
}

export class DeadLetterListDto {
  @ApiProperty({ type: [DeadLetterDto] })
  dead_letters!: DeadLetterDto[];
  @ApiPropertyOptional({
    description:
      'Set when more may follow: the ?after= of the next page. With ?workflow= it may be a dead letter of another ' +
      'workflow, the last one the page looked at',
  })
  next?: string;
}

export class RedrivenDto {
  @ApiProperty({ description: 'The dead letter re-driven, its id as listed (a summaries/ prefix dropped)' })
  dead_letter!: string;
  @ApiProperty({ format: 'uuid' })
  job_id!: string;
  @ApiProperty({ description: 'Its workflow (summaries for a summary job)' })
  workflow!: string;
  @ApiProperty({ description: "The new entry in the dead letter's partition's job stream ({summaries}:jobs with one)" })
  entry!: string;
}

export class RedriveAllDto {
  @ApiProperty()
  redriven!: number;
  @ApiProperty({ type: [String], description: 'Dead letters with no job to run (recorded by id only); they stay' })
  notRedrivable!: string[];
  @ApiPropertyOptional({ description: 'Set when the limit stopped the walk: call again with ?after=<next>' })
  next?: string;
}

export class ParkedMessageDto {
  @ApiProperty({ description: 'The outbox row id' })
  id!: string;
  @ApiProperty()
  topic!: string;
  @ApiProperty()
  dedupeKey!: string;
  @ApiProperty()
  attempts!: number;
  @ApiProperty({ type: String, nullable: true })
  lastError!: string | null;
  @ApiProperty({ type: String, format: 'date-time' })
  createdAt!: Date;
  @ApiProperty({ type: String, format: 'date-time' })
  parkedAt!: Date;
}

export class ParkedListDto {
  @ApiProperty({ type: [ParkedMessageDto] })
  parked!: ParkedMessageDto[];
}

export class RequeuedDto {
  @ApiProperty({ type: [String], description: 'The outbox row ids re-queued' })
  requeued!: string[];
}
