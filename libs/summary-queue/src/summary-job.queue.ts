import { Injectable, Optional } from '@nestjs/common';
import { type Durability, InjectRedis, InjectRedisDurability, type RedisClient } from '@app/redis';
import { type QueueFigures, queueFigures, writeRunStart } from '@app/workflows';
import type { ChainableCommander } from 'ioredis';
import { CONSUMER_GROUP, JOB_RECORD_TTL_MS, SummaryJob } from './summary-job';
import { SINGLE_STREAM, type StreamPartition, SummaryStreams } from './summary-streams';
import { isUuid } from '@app/ids';

/**
 * Adds to a dead-letter MULTI what marks the entry's job failed where GET
 * reads it (`reason` as its error), so the dead letter and the job record
 * change together: the record is the one of `partition`, the partition whose
 * stream the entry was in, so it shares that stream's hash slot. An entry
 * without a usable job id or tenant has no record to mark and adds nothing.
 */
export function markSummaryJobFailed(
  tx: ChainableCommander,
  fields: Readonly<Record<string, string>>,
  reason: string,
  partition: StreamPartition = SINGLE_STREAM.partitions[0],
): void {
  const { job_id: jobId, tenant } = fields;
  if (!jobId || !tenant || !isUuid(jobId)) return;
  const key = partition.jobRecordKey(jobId);
  tx.hset(key, 'tenant', tenant, 'status', 'failed', 'error', reason).pexpire(key, JOB_RECORD_TTL_MS);
}

/* A queue's figures are the workflows library's (every queue has them); re-exported under the names of old. */
export type { PartitionFigures, QueueFigures, StreamFigures } from '@app/workflows';

export interface JobRecord {
  readonly tenant: string;
  readonly acceptedAt: Date;
  readonly status?: 'failed';
  readonly error?: string;
}

@Injectable()
export class SummaryJobQueue {
  constructor(
    @InjectRedis() private readonly redis: RedisClient,
    @Optional() private readonly streams: SummaryStreams = SINGLE_STREAM,
    @Optional() @InjectRedisDurability() private readonly durability?: Durability,
  ) {}

  /**
   * Queues a summaries job of a known id: the start of a summaries run,
   * written by the workflows' one start script (writeRunStart), as the api's
   * POST /v1/summaries writes it through WorkflowClient. For tests, benches
   * and tools that name the job themselves; a route starts through its
   * WorkflowHandle, whose run id comes from the request. Returns the entry id;
   * durable as RedisModule's durability asks (RunNotQueuedError otherwise).
   */
  async enqueue(job: SummaryJob): Promise<string> {
    const { jobId, tenant, payload } = job;
    return writeRunStart(this.redis, this.streams.of(jobId), { runId: jobId, tenant, input: payload }, this.durability);
  }

  /** The record in the job's partition (by its id, under the partition count configured now). */
  async findRecord(jobId: string): Promise<JobRecord | undefined> {
    const h = await this.redis.hgetall(this.streams.of(jobId).jobRecordKey(jobId));
    if (!h.tenant) return undefined;
    return {
      tenant: h.tenant,
      acceptedAt: new Date(Number(h.accepted_at)),
      ...(h.status === 'failed' ? { status: 'failed' as const, error: h.error ?? 'failed' } : {}),
    };
  }

  /** The queue's figures, in total and by partition. */
  figures(): Promise<QueueFigures> {
    return queueFigures(this.redis, this.streams, CONSUMER_GROUP);
  }
}
