import { Injectable } from '@nestjs/common';
import { InjectRedis, RedisScript, type RedisClient } from '@app/redis';
import {
  ADMIN_ACTIONS_KEY,
  DEAD_LETTER_STREAM,
  fieldsOf,
  JOB_RECORD_TTL_MS,
  jobRecordKey,
  JOBS_STREAM,
} from './summary-job';

export interface DeadLetter {
  /** The dead-letter entry's id: what a re-drive names. */
  readonly id: string;
  readonly sourceId?: string;
  readonly reason?: string;
  readonly detail?: string;
  readonly jobId?: string;
  readonly tenant?: string;
  readonly deadLetteredAt: Date;
}

export type RedriveResult =
  | { readonly outcome: 'redriven'; readonly jobId: string; readonly entryId: string }
  | { readonly outcome: 'not_found' }
  /** Nothing to run: the entry was recorded by id only (deleted from the stream) or is malformed. */
  | { readonly outcome: 'not_redrivable'; readonly reason?: string };

/*
 * Back into the job stream with the same job id (a re-drive of a job that
 * did finish meanwhile is a harmless duplicate), out of the dead letters, and
 * the job record back to queued, and the re-drive counted: atomically, so
 * two operators re-driving the same entry start it once and count it once.
 * KEYS: dead stream, job stream, job record, admin actions.
 */
const REDRIVE = new RedisScript(
  'jobs-redrive',
  `local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local id = redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[2], 'tenant', ARGV[3], 'payload', ARGV[4])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], 'status', 'error')
redis.call('HSET', KEYS[3], 'tenant', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call('HINCRBY', KEYS[4], 'redrive', 1)
return id`,
);

/** Redis keeps both parts of a stream id as unsigned 64-bit integers. */
export const STREAM_ID_PART_MAX = 2n ** 64n - 1n;
/** The largest stream id: nothing comes after it (and Redis refuses a range that starts after it). */
export const LAST_STREAM_ID = `${STREAM_ID_PART_MAX}-${STREAM_ID_PART_MAX}`;

/** The dead-letter stream, for the people who mend it (admin API and CLI). */
@Injectable()
export class DeadLetterQueue {
  constructor(@InjectRedis() private readonly redis: RedisClient) {}

  /** Oldest first; `after` is the last id of the previous page. */
  async list(count = 50, after?: string): Promise<DeadLetter[]> {
    if (after === LAST_STREAM_ID) return [];
    const entries = await this.redis.xrange(DEAD_LETTER_STREAM, after ? `(${after}` : '-', '+', 'COUNT', count);
    return entries.map(([id, flat]) => {
      const f = fieldsOf(flat);
      return {
        id,
        sourceId: f.source_id,
        reason: f.reason,
        detail: f.detail,
        jobId: f.job_id,
        tenant: f.tenant,
        deadLetteredAt: new Date(Number(id.split('-')[0])),
      };
    });
  }

  async length(): Promise<number> {
    return this.redis.xlen(DEAD_LETTER_STREAM);
  }

  async redrive(id: string): Promise<RedriveResult> {
    const [entry] = await this.redis.xrange(DEAD_LETTER_STREAM, id, id);
    if (!entry) return { outcome: 'not_found' };
    const f = fieldsOf(entry[1]);
    if (!f.job_id || !f.tenant || !f.payload) return { outcome: 'not_redrivable', reason: f.reason };
    const entryId = await REDRIVE.run<string | null>(
      this.redis,
      [DEAD_LETTER_STREAM, JOBS_STREAM, jobRecordKey(f.job_id), ADMIN_ACTIONS_KEY],
      [id, f.job_id, f.tenant, f.payload, JOB_RECORD_TTL_MS],
    );
    return entryId ? { outcome: 'redriven', jobId: f.job_id, entryId } : { outcome: 'not_found' };
  }
}
