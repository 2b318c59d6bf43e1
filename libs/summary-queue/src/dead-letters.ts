import { Injectable, Optional } from '@nestjs/common';
import { InjectRedis, RedisScript, type RedisClient } from '@app/redis';
import type { QueuePartition } from '@app/workflows';
import { type OperatedQueue, OperatedQueues } from './operated-queues';
import { fieldsOf, JOB_RECORD_TTL_MS } from './summary-job';

export interface DeadLetter {
  /**
   * What a re-drive names: the dead-letter entry's stream id, `<ms>-<seq>`,
   * with one partition; `<partition>:<ms>-<seq>` with several; for any queue
   * but summaries, prefixed with the queue's name: `workflows/<ms>-<seq>`.
   */
  readonly id: string;
  /** The queue it was dead-lettered in (`summaries`, `workflows`). */
  readonly queue: string;
  readonly partition: number;
  /** Its `workflow` field, or the queue's name when it has none (a queue of one workflow). */
  readonly workflow: string;
  /** The step that failed; absent: the workflow's first step (and summaries' only one). */
  readonly step?: string;
  readonly sourceId?: string;
  readonly reason?: string;
  readonly detail?: string;
  /** The job id, which is the run id of a workflow run. */
  readonly jobId?: string;
  /** The same as jobId, under its workflows name. */
  readonly runId?: string;
  readonly tenant?: string;
  readonly deadLetteredAt: Date;
}

/** One dead letter as an operator inspects it: every field of the entry as stored, besides the named ones. */
export interface DeadLetterDetail extends DeadLetter {
  readonly fields: Readonly<Record<string, string>>;
}

/** Which dead letters: those of one workflow (its `workflow` field, else its queue's name). */
export interface DeadLetterFilter {
  readonly workflow?: string;
}

export type RedriveResult =
  | { readonly outcome: 'redriven'; readonly jobId: string; readonly entryId: string; readonly workflow: string }
  | { readonly outcome: 'not_found' }
  /** Nothing to run: the entry was recorded by id only (deleted from the stream) or is malformed. */
  | { readonly outcome: 'not_redrivable'; readonly reason?: string };

/*
 * Back into the job stream with every field it had (the same job id, and a
 * workflow step's `workflow`, `step`, `state` and whatever a later version
 * adds; only the dead letter's own `reason`, `detail` and `source_id` stay
 * behind), out of the dead letters, the job record back to queued, and the
 * re-drive counted: atomically, so two operators re-driving the same entry
 * start it once and count it once. A re-drive of a job that did finish
 * meanwhile is a harmless duplicate.
 * KEYS: dead stream, job stream, job record, admin actions, all of the
 * dead letter's partition: it goes back into the stream it came from.
 * ARGV: the dead letter's stream id, its job id (the record KEYS[3] is
 * that job's), the record's TTL.
 */
const REDRIVE = new RedisScript(
  'jobs-redrive',
  `local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local flat = e[1][2]
local fields = {}
local f = {}
for i = 1, #flat, 2 do
  local k = flat[i]
  f[k] = flat[i + 1]
  if k ~= 'reason' and k ~= 'detail' and k ~= 'source_id' then
    fields[#fields + 1] = k
    fields[#fields + 1] = flat[i + 1]
  end
end
if f['job_id'] ~= ARGV[2] or not f['tenant'] then return false end
local id = redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], 'status', 'error')
redis.call('HSET', KEYS[3], 'tenant', f['tenant'])
if f['workflow'] then redis.call('HSET', KEYS[3], 'workflow', f['workflow']) end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
redis.call('HINCRBY', KEYS[4], 'redrive', 1)
return id`,
);

/** Redis keeps both parts of a stream id as unsigned 64-bit integers. */
export const STREAM_ID_PART_MAX = 2n ** 64n - 1n;
/** The largest stream id: nothing comes after it (and Redis refuses a range that starts after it). */
export const LAST_STREAM_ID = `${STREAM_ID_PART_MAX}-${STREAM_ID_PART_MAX}`;

/** A dead-letter id that names no partition (or no queue) of this system, or none at all where there are several. */
export class NoSuchPartitionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A dead letter's place: its queue (by position: the order of ties), partition, and id in that dead-letter stream. */
interface Located {
  readonly queueIndex: number;
  readonly queue: OperatedQueue;
  readonly partition: QueuePartition;
  readonly streamId: string;
}

/** Stream ids in their order: by milliseconds, then sequence (both beyond 2^53, hence bigint). */
function compareStreamIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(BigInt);
  const [bm, bs] = b.split('-').map(BigInt);
  if (am !== bm) return am < bm ? -1 : 1;
  return as === bs ? 0 : as < bs ? -1 : 1;
}

/** Entries read per dead-letter stream per round when a filter may skip most of them. */
const SCAN_BATCH = 200;

interface Read {
  readonly at: Located;
  readonly letter: DeadLetterDetail;
}

/**
 * Every queue's and partition's dead-letter stream (OperatedQueues), for the
 * people who mend them (admin API and CLI), as one list: oldest first across
 * queues and partitions (ties by queue, then partition number), so a page's
 * last id is a cursor for the next.
 */
@Injectable()
export class DeadLetterQueue {
  constructor(
    @InjectRedis() private readonly redis: RedisClient,
    @Optional() private readonly queues: OperatedQueues = new OperatedQueues(),
  ) {}

  /** Oldest first across queues and partitions; `after` is the last id of the previous page. */
  async list(count = 50, after?: string, filter: DeadLetterFilter = {}): Promise<DeadLetter[]> {
    const out: DeadLetter[] = [];
    let cursor = after === undefined ? undefined : this.locate(after);
    for (;;) {
      const batch = filter.workflow === undefined ? count : Math.max(count, SCAN_BATCH);
      const page = await this.read(batch, cursor);
      for (const { letter } of page) {
        if (!matches(letter, filter)) continue;
        const { fields: _fields, ...plain } = letter;
        out.push(plain);
        if (out.length === count) return out;
      }
      if (page.length < batch) return out;
      cursor = page[page.length - 1].at;
    }
  }

  /** One dead letter with every field; undefined when there is none with that id. */
  async inspect(id: string): Promise<DeadLetterDetail | undefined> {
    const at = this.locate(id);
    const [entry] = await this.redis.xrange(at.partition.dead, at.streamId, at.streamId);
    return entry && this.letter(at, fieldsOf(entry[1]));
  }

  /** Dead letters in every queue and partition, or of one workflow (which reads them all). */
  async length(filter: DeadLetterFilter = {}): Promise<number> {
    if (filter.workflow === undefined) {
      const streams = this.queues.all.flatMap((q) => q.layout.partitions.map((p) => p.dead));
      const lengths = await Promise.all(streams.map((key) => this.redis.xlen(key)));
      return lengths.reduce((n, l) => n + l, 0);
    }
    let n = 0;
    let cursor: Located | undefined;
    for (;;) {
      const page = await this.read(SCAN_BATCH, cursor);
      n += page.filter(({ letter }) => matches(letter, filter)).length;
      if (page.length < SCAN_BATCH) return n;
      cursor = page[page.length - 1].at;
    }
  }

  /** Back into its own queue's and partition's job stream; a NoSuchPartitionError when the id names neither. */
  async redrive(id: string): Promise<RedriveResult> {
    const at = this.locate(id);
    const { partition, streamId } = at;
    const [entry] = await this.redis.xrange(partition.dead, streamId, streamId);
    if (!entry) return { outcome: 'not_found' };
    const f = fieldsOf(entry[1]);
    if (!f.job_id || !f.tenant || !f.payload) return { outcome: 'not_redrivable', reason: f.reason };
    const entryId = await REDRIVE.run<string | null>(
      this.redis,
      [partition.dead, partition.jobs, partition.jobRecordKey(f.job_id), partition.adminActions],
      [streamId, f.job_id, JOB_RECORD_TTL_MS],
    );
    return entryId
      ? { outcome: 'redriven', jobId: f.job_id, entryId, workflow: f.workflow ?? at.queue.name }
      : { outcome: 'not_found' };
  }

  /**
   * The first `count` dead letters after `from` in the order of the list:
   * each stream's first `count` after it, merged. A stream up to the
   * cursor's (by queue, then partition) resumes after its id; a later one at
   * it (ties go by queue, then partition).
   */
  private async read(count: number, from: Located | undefined): Promise<Read[]> {
    const streams = this.queues.all.flatMap((queue, queueIndex) =>
      queue.layout.partitions.map((partition) => ({ queueIndex, queue, partition })),
    );
    const pages = await Promise.all(
      streams.map(async (s) => {
        let start = '-';
        if (from) {
          const exclusive =
            s.queueIndex < from.queueIndex ||
            (s.queueIndex === from.queueIndex && s.partition.index <= from.partition.index);
          if (exclusive && from.streamId === LAST_STREAM_ID) return [];
          start = exclusive ? `(${from.streamId}` : from.streamId;
        }
        const entries = await this.redis.xrange(s.partition.dead, start, '+', 'COUNT', count);
        return entries.map(([streamId, flat]): Read => {
          const at = { ...s, streamId };
          return { at, letter: this.letter(at, fieldsOf(flat)) };
        });
      }),
    );
    const merged = pages.flat();
    merged.sort(
      (a, b) =>
        compareStreamIds(a.at.streamId, b.at.streamId) ||
        a.at.queueIndex - b.at.queueIndex ||
        a.at.partition.index - b.at.partition.index,
    );
    return merged.slice(0, count);
  }

  /**
   * Where a dead-letter id (well formed: parseDeadLetterId) points:
   * `[<queue>/][<partition>:]<ms>-<seq>`, the partition named exactly when
   * there are several, the queue when it is not summaries.
   */
  private locate(id: string): Located {
    const slash = id.indexOf('/');
    const queue = slash < 0 ? this.queues.default : this.queues.named(id.slice(0, slash));
    if (!queue) {
      const names = this.queues.all.map((q) => q.name).join(', ');
      throw new NoSuchPartitionError(`no queue ${id.slice(0, slash)}: the queues are ${names}`);
    }
    const queueIndex = this.queues.all.indexOf(queue);
    const rest = id.slice(slash + 1);
    const prefix = slash < 0 ? '' : `${queue.name}/`;
    const colon = rest.indexOf(':');
    const { count } = queue.layout;
    if (colon < 0) {
      if (count === 1) return { queueIndex, queue, partition: queue.layout.partitions[0], streamId: rest };
      throw new NoSuchPartitionError(
        `with ${count} partitions a dead-letter id names its partition: ${prefix}<partition>:<ms>-<seq>, e.g. ${prefix}0:${rest}`,
      );
    }
    const partition = queue.layout.at(Number(rest.slice(0, colon)));
    if (!partition) {
      throw new NoSuchPartitionError(
        `no partition ${rest.slice(0, colon)}: JOB_STREAM_PARTITIONS is ${count} (partitions 0 to ${count - 1})`,
      );
    }
    return { queueIndex, queue, partition, streamId: rest.slice(colon + 1) };
  }

  private letter(at: Omit<Located, 'queueIndex'>, f: Record<string, string>): DeadLetterDetail {
    const { queue, partition, streamId } = at;
    const local = queue.layout.count === 1 ? streamId : `${partition.index}:${streamId}`;
    return {
      id: queue === this.queues.default ? local : `${queue.name}/${local}`,
      queue: queue.name,
      partition: partition.index,
      workflow: f.workflow ?? queue.name,
      step: f.step,
      sourceId: f.source_id,
      reason: f.reason,
      detail: f.detail,
      jobId: f.job_id,
      runId: f.job_id,
      tenant: f.tenant,
      deadLetteredAt: new Date(Number(streamId.split('-')[0])),
      fields: f,
    };
  }
}

function matches(letter: DeadLetter, filter: DeadLetterFilter): boolean {
  return filter.workflow === undefined || letter.workflow === filter.workflow;
}
