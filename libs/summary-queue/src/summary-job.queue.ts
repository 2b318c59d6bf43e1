import { Injectable, Optional } from '@nestjs/common';
import { type Durability, InjectRedis, InjectRedisDurability, RedisScript, type RedisClient } from '@app/redis';
import type { ChainableCommander } from 'ioredis';
import { CONSUMER_GROUP, JOB_RECORD_TTL_MS, SummaryJob } from './summary-job';
import { queueFigures } from './queue-figures';
import { SINGLE_STREAM, type StreamPartition, SummaryStreams } from './summary-streams';
import { isUuid } from '@app/ids';

/*
 * The job record and the stream entry are written by one script: one round
 * trip, and never one without the other (both under the job's partition's tag). accepted_at keeps the first time;
 * a re-enqueue (a retry after a crash before the idempotency record was
 * finalised) adds a second entry with the same job id, which the worker
 * deduplicates.
 */
const ENQUEUE = new RedisScript(
  'jobs-enqueue',
  `redis.call('HSET', KEYS[1], 'tenant', ARGV[2])
redis.call('HSETNX', KEYS[1], 'accepted_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[1], 'tenant', ARGV[2], 'payload', ARGV[3])`,
);

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

export interface StreamFigures {
  /** Entries not yet acknowledged (acknowledged entries are deleted). */
  readonly length: number;
  /** Of those, delivered to a consumer and not yet acknowledged. */
  readonly pending: number;
  readonly deadLetters: number;
}

export interface PartitionFigures extends StreamFigures {
  readonly partition: number;
}

/** The sums over every partition, and each partition's own. */
export interface QueueFigures extends StreamFigures {
  readonly partitions: readonly PartitionFigures[];
}

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
   * Records the job and appends it to its partition's stream; returns the
   * entry id. On a cluster it resolves only once a replica holds both (WAIT,
   * RedisModule's durability): a master lost a moment later loses no job that
   * was acknowledged. NotReplicatedError when no replica confirms in time: the
   * job may still be on the master, and a retry with the same job id is run
   * once by the worker.
   */
  async enqueue(job: SummaryJob): Promise<string> {
    const partition = this.streams.of(job.jobId);
    return ENQUEUE.runDurably<string>(
      this.redis,
      [partition.jobRecordKey(job.jobId), partition.jobs],
      [job.jobId, job.tenant, JSON.stringify(job.payload), Date.now(), JOB_RECORD_TTL_MS],
      this.durability,
    );
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
