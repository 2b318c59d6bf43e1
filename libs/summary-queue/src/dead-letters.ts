import { Injectable, Optional } from '@nestjs/common';
import { InjectRedis, RedisScript, type RedisClient } from '@app/redis';
import { fieldsOf, JOB_RECORD_TTL_MS } from './summary-job';
import { SINGLE_STREAM, type StreamPartition, SummaryStreams } from './summary-streams';

export interface DeadLetter {
  /**
   * What a re-drive names: the dead-letter entry's stream id, `<ms>-<seq>`,
   * with one partition; `<partition>:<ms>-<seq>` with several.
   */
  readonly id: string;
  readonly partition: number;
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
 * KEYS: dead stream, job stream, job record, admin actions, all of the
 * dead letter's partition: it goes back into the stream it came from.
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

/** A dead-letter id that names no partition of this system (or none at all, where there are several). */
export class NoSuchPartitionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A dead letter's place: its partition and its id in that partition's dead-letter stream. */
interface Located {
  readonly partition: StreamPartition;
  readonly streamId: string;
}

/** Stream ids in their order: by milliseconds, then sequence (both beyond 2^53, hence bigint). */
function compareStreamIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(BigInt);
  const [bm, bs] = b.split('-').map(BigInt);
  if (am !== bm) return am < bm ? -1 : 1;
  return as === bs ? 0 : as < bs ? -1 : 1;
}

/**
 * Every partition's dead-letter stream, for the people who mend them (admin
 * API and CLI), as one list: oldest first across partitions (ties between
 * partitions by partition number), so a page's last id is a cursor for the next.
 */
@Injectable()
export class DeadLetterQueue {
  constructor(
    @InjectRedis() private readonly redis: RedisClient,
    @Optional() private readonly streams: SummaryStreams = SINGLE_STREAM,
  ) {}

  /** Oldest first across partitions; `after` is the last id of the previous page. */
  async list(count = 50, after?: string): Promise<DeadLetter[]> {
    const from = after === undefined ? undefined : this.locate(after);
    const pages = await Promise.all(
      this.streams.partitions.map(async (partition) => {
        let start = '-';
        if (from) {
          // Partitions up to the cursor's resume after its id; later ones resume at it (ties go by partition).
          const exclusive = partition.index <= from.partition.index;
          if (exclusive && from.streamId === LAST_STREAM_ID) return [];
          start = exclusive ? `(${from.streamId}` : from.streamId;
        }
        const entries = await this.redis.xrange(partition.dead, start, '+', 'COUNT', count);
        return entries.map(([id, flat]) => this.letter(partition, id, fieldsOf(flat)));
      }),
    );
    const merged = pages.flat().map((letter) => ({ letter, streamId: this.locate(letter.id).streamId }));
    merged.sort((a, b) => compareStreamIds(a.streamId, b.streamId) || a.letter.partition - b.letter.partition);
    return merged.slice(0, count).map((m) => m.letter);
  }

  /** Dead letters in every partition. */
  async length(): Promise<number> {
    const lengths = await Promise.all(this.streams.partitions.map((p) => this.redis.xlen(p.dead)));
    return lengths.reduce((n, l) => n + l, 0);
  }

  /** Back into its own partition's job stream; a NoSuchPartitionError when the id names no partition. */
  async redrive(id: string): Promise<RedriveResult> {
    const { partition, streamId } = this.locate(id);
    const [entry] = await this.redis.xrange(partition.dead, streamId, streamId);
    if (!entry) return { outcome: 'not_found' };
    const f = fieldsOf(entry[1]);
    if (!f.job_id || !f.tenant || !f.payload) return { outcome: 'not_redrivable', reason: f.reason };
    const entryId = await REDRIVE.run<string | null>(
      this.redis,
      [partition.dead, partition.jobs, partition.jobRecordKey(f.job_id), partition.adminActions],
      [streamId, f.job_id, f.tenant, f.payload, JOB_RECORD_TTL_MS],
    );
    return entryId ? { outcome: 'redriven', jobId: f.job_id, entryId } : { outcome: 'not_found' };
  }

  /**
   * Where a dead-letter id (well formed: parseDeadLetterId) points: `<ms>-<seq>`
   * with one partition, `<partition>:<ms>-<seq>` with several.
   */
  private locate(id: string): Located {
    const colon = id.indexOf(':');
    const count = this.streams.count;
    if (colon < 0) {
      if (count === 1) return { partition: this.streams.partitions[0], streamId: id };
      throw new NoSuchPartitionError(
        `with ${count} partitions a dead-letter id names its partition: <partition>:<ms>-<seq>, e.g. 0:${id}`,
      );
    }
    const partition = this.streams.at(Number(id.slice(0, colon)));
    if (!partition) {
      throw new NoSuchPartitionError(
        `no partition ${id.slice(0, colon)}: JOB_STREAM_PARTITIONS is ${count} (partitions 0 to ${count - 1})`,
      );
    }
    return { partition, streamId: id.slice(colon + 1) };
  }

  private letter(partition: StreamPartition, streamId: string, f: Record<string, string>): DeadLetter {
    return {
      id: this.streams.count === 1 ? streamId : `${partition.index}:${streamId}`,
      partition: partition.index,
      sourceId: f.source_id,
      reason: f.reason,
      detail: f.detail,
      jobId: f.job_id,
      tenant: f.tenant,
      deadLetteredAt: new Date(Number(streamId.split('-')[0])),
    };
  }
}
