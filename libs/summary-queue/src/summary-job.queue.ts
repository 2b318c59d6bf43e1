import { Injectable } from '@nestjs/common';
import { InjectRedis, RedisScript, type RedisClient } from '@app/redis';
import type { ChainableCommander } from 'ioredis';
import {
  CONSUMER_GROUP,
  DEAD_LETTER_STREAM,
  JOB_RECORD_TTL_MS,
  JOBS_STREAM,
  jobRecordKey,
  SummaryJob,
} from './summary-job';
import { isUuid } from '@app/ids';

/*
 * The job record and the stream entry are written by one script: one round
 * trip, and never one without the other. accepted_at keeps the first time;
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
 * change together: the record shares the streams' hash slot. An entry without
 * a usable job id or tenant has no record to mark and adds nothing.
 */
export function markSummaryJobFailed(
  tx: ChainableCommander,
  fields: Readonly<Record<string, string>>,
  reason: string,
): void {
  const { job_id: jobId, tenant } = fields;
  if (!jobId || !tenant || !isUuid(jobId)) return;
  tx.hset(jobRecordKey(jobId), 'tenant', tenant, 'status', 'failed', 'error', reason).pexpire(
    jobRecordKey(jobId),
    JOB_RECORD_TTL_MS,
  );
}

export interface QueueFigures {
  /** Entries not yet acknowledged (acknowledged entries are deleted). */
  readonly length: number;
  /** Of those, delivered to a consumer and not yet acknowledged. */
  readonly pending: number;
  readonly deadLetters: number;
}

export interface JobRecord {
  readonly tenant: string;
  readonly acceptedAt: Date;
  readonly status?: 'failed';
  readonly error?: string;
}

@Injectable()
export class SummaryJobQueue {
  constructor(@InjectRedis() private readonly redis: RedisClient) {}

  /** Records the job and appends it to the stream; returns the entry id. */
  async enqueue(job: SummaryJob): Promise<string> {
    return ENQUEUE.run<string>(
      this.redis,
      [jobRecordKey(job.jobId), JOBS_STREAM],
      [job.jobId, job.tenant, JSON.stringify(job.payload), Date.now(), JOB_RECORD_TTL_MS],
    );
  }

  async findRecord(jobId: string): Promise<JobRecord | undefined> {
    const h = await this.redis.hgetall(jobRecordKey(jobId));
    if (!h.tenant) return undefined;
    return {
      tenant: h.tenant,
      acceptedAt: new Date(Number(h.accepted_at)),
      ...(h.status === 'failed' ? { status: 'failed' as const, error: h.error ?? 'failed' } : {}),
    };
  }

  /** The queue's figures in one round trip. */
  async figures(): Promise<QueueFigures> {
    const results = await this.redis
      .pipeline()
      .xlen(JOBS_STREAM)
      .xpending(JOBS_STREAM, CONSUMER_GROUP)
      .xlen(DEAD_LETTER_STREAM)
      .exec();
    const value = (i: number): unknown => {
      const [err, v] = results?.[i] ?? [new Error('no reply'), null];
      // No group yet (no worker has started): nothing is pending.
      if (err && i === 1 && err.message.includes('NOGROUP')) return [0];
      if (err) throw err;
      return v;
    };
    return {
      length: Number(value(0)),
      pending: Number((value(1) as [number])[0]),
      deadLetters: Number(value(2)),
    };
  }
}
