import { Injectable } from '@nestjs/common';
import { InjectRedis, RedisScript } from '@app/redis';
import type { Redis } from 'ioredis';
import { JOB_RECORD_TTL_MS, JOBS_STREAM, jobRecordKey, SummaryJob } from './summary-job';

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

export interface JobRecord {
  readonly tenant: string;
  readonly acceptedAt: Date;
  readonly status?: 'failed';
  readonly error?: string;
}

@Injectable()
export class SummaryJobQueue {
  constructor(@InjectRedis() private readonly redis: Redis) {}

  /** Records the job and appends it to the stream; returns the entry id. */
  async enqueue(job: SummaryJob): Promise<string> {
    return ENQUEUE.run<string>(this.redis, [jobRecordKey(job.jobId), JOBS_STREAM], [
      job.jobId,
      job.tenant,
      JSON.stringify(job.payload),
      Date.now(),
      JOB_RECORD_TTL_MS,
    ]);
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
}
