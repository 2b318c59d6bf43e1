import { Inject, Injectable, Optional } from '@nestjs/common';
import { InjectRedis, RedisScript, type RedisClient } from '@app/redis';
import { DEAD_LETTER_OWN_FIELDS, type OperatedQueue, OperatedQueues, type QueuePartition } from '@app/workflows';
import { operatedQueues } from './operated-queues';
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
  /**
   * Its `workflow` field, else its queue's own workflow (summaries'), else
   * its queue's name: a record of the shared queue without one
   * (`deleted_from_stream`) names no workflow but `workflows`.
   */
  readonly workflow: string;
  /** The step that failed; absent: the workflow's first step (and summaries' only one). */
  readonly step?: string;
  readonly sourceId?: string;
  readonly reason?: string;
  readonly detail?: string;
  /** The job id, which is the run id of a workflow run. */
  readonly jobId?: string;
  readonly tenant?: string;
  readonly deadLetteredAt: Date;
}

/** One dead letter as an operator inspects it: every field of the entry as stored, besides the named ones. */
export interface DeadLetterDetail extends DeadLetter {
  readonly fields: Readonly<Record<string, string>>;
}

/** Which dead letters: those of one workflow (its `workflow` field, else its queue's workflow or name). */
export interface DeadLetterFilter {
  readonly workflow?: string;
}

/** Each dead-letter stream's newest id at one moment, by stream key; a stream missing from it was empty. */
export type DeadLetterBounds = ReadonlyMap<string, string>;

/** A page of dead letters, and where the next one starts. */
export interface DeadLetterPage {
  readonly letters: DeadLetter[];
  /**
   * Set when more dead letters may follow: the id of the last one looked at,
   * the `after` of the next page. With a filter it may be one that did not
   * match: a page looks at a bounded number of dead letters.
   */
  readonly next?: string;
}

export type RedriveResult =
  | {
      readonly outcome: 'redriven';
      /** The dead letter's id as the listing gives it (a `summaries/` prefix dropped). */
      readonly deadLetter: string;
      readonly jobId: string;
      readonly entryId: string;
      readonly workflow: string;
    }
  | { readonly outcome: 'not_found' }
  /** Nothing to run: the entry was recorded by id only (deleted from the stream) or is malformed. */
  | { readonly outcome: 'not_redrivable'; readonly reason?: string };

/** How far the dead-letter walks read and look; tests make them small to cross their bounds. */
export interface DeadLetterScanSettings {
  /** Entries read from one stream per XRANGE. Default 200. */
  readonly batch?: number;
  /** The most dead letters a filtered listing looks at before it answers with `next`. Default 1000. */
  readonly listExamine?: number;
}

export const DEAD_LETTER_SCAN_SETTINGS = 'summary-queue:dead-letter-scan-settings';

const SCAN_BATCH = 200;
const LIST_EXAMINE = 1000;

/*
 * Back into the job stream with every field it had (the same job id, and a
 * workflow step's `workflow`, `step`, `state` and whatever a later version
 * adds; only the dead letter's own fields, DEAD_LETTER_OWN_FIELDS, stay
 * behind) plus `redriven`, the times it was re-driven (the engine's begin
 * sets a failed run running again for such an entry only: a late reclaim of
 * a dead-lettered run's entry must not revive it), out of the dead letters,
 * the job record back to queued, and the
 * re-drive counted: atomically, so two operators re-driving the same entry
 * start it once and count it once. A re-drive of a job that did finish
 * meanwhile is a harmless duplicate.
 * KEYS: dead stream, job stream, job record, admin actions, all of the
 * dead letter's partition: it goes back into the stream it came from.
 * ARGV: the dead letter's stream id, its job id (the record KEYS[3] is
 * that job's), the record's TTL, then the dead letter's own field names.
 */
const REDRIVE = new RedisScript(
  'jobs-redrive',
  `local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local own = {}
for i = 4, #ARGV do own[ARGV[i]] = true end
local flat = e[1][2]
local fields = {}
local f = {}
for i = 1, #flat, 2 do
  local k = flat[i]
  f[k] = flat[i + 1]
  if not own[k] and k ~= 'redriven' then
    fields[#fields + 1] = k
    fields[#fields + 1] = flat[i + 1]
  end
end
if f['job_id'] ~= ARGV[2] or not f['tenant'] then return false end
fields[#fields + 1] = 'redriven'
fields[#fields + 1] = tostring((tonumber(f['redriven']) or 0) + 1)
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

/** A dead-letter id that names no partition of its queue, or none at all where there are several. */
export class NoSuchPartitionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A dead-letter id that names a queue the admin tools do not cover. */
export class NoSuchQueueError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** One dead-letter stream: its queue (by position: the order of ties) and partition. */
interface Stream {
  readonly queueIndex: number;
  readonly queue: OperatedQueue;
  readonly partition: QueuePartition;
}

/** A dead letter's place: its stream, and its id there. */
interface Located extends Stream {
  readonly streamId: string;
}

/** Stream ids in their order: by milliseconds, then sequence (both beyond 2^53, hence bigint). */
function compareStreamIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(BigInt);
  const [bm, bs] = b.split('-').map(BigInt);
  if (am !== bm) return am < bm ? -1 : 1;
  return as === bs ? 0 : as < bs ? -1 : 1;
}

/** The list's order: by stream id, ties by queue, then partition. */
function compareLocated(a: Located, b: Located): number {
  return (
    compareStreamIds(a.streamId, b.streamId) || a.queueIndex - b.queueIndex || a.partition.index - b.partition.index
  );
}

export function matchesFilter(letter: DeadLetter, filter: DeadLetterFilter): boolean {
  return filter.workflow === undefined || letter.workflow === filter.workflow;
}

interface Read {
  readonly at: Located;
  readonly letter: DeadLetterDetail;
}

/** One stream's place in a walk: where its next read starts, what was read and not yet looked at. */
interface StreamCursor extends Stream {
  /** XRANGE's start: `-`, an id (inclusive) or `(id` (exclusive). */
  start: string;
  /** XRANGE's end: `+`, or the stream's newest id when the walk began. */
  readonly end: string;
  buffer: Read[];
  /** The last read came back short: nothing more up to `end`. */
  dry: boolean;
}

/**
 * A walk over every dead-letter stream at once, oldest first across them
 * (ties by queue, then partition): each stream keeps its own cursor, and
 * only a stream whose read entries ran out is read again, so a walk reads
 * each entry once however far it goes.
 */
export class DeadLetterWalk {
  constructor(
    private readonly redis: RedisClient,
    private readonly cursors: StreamCursor[],
    private readonly batch: number,
    private readonly letter: (at: Located, fields: Record<string, string>) => DeadLetterDetail,
  ) {}

  /** The next dead letter in the list's order, or undefined at the end. */
  async next(): Promise<DeadLetterDetail | undefined> {
    await this.refill();
    let first: StreamCursor | undefined;
    for (const c of this.cursors) {
      if (c.buffer.length > 0 && (!first || compareLocated(c.buffer[0].at, first.buffer[0].at) < 0)) first = c;
    }
    return first?.buffer.shift()?.letter;
  }

  /** Whether a next() would find one. */
  async more(): Promise<boolean> {
    await this.refill();
    return this.cursors.some((c) => c.buffer.length > 0);
  }

  private async refill(): Promise<void> {
    await Promise.all(this.cursors.filter((c) => c.buffer.length === 0 && !c.dry).map((c) => this.read(c)));
  }

  private async read(c: StreamCursor): Promise<void> {
    const entries = await this.redis.xrange(c.partition.dead, c.start, c.end, 'COUNT', this.batch);
    c.buffer = entries.map(([streamId, flat]): Read => {
      const at = { queueIndex: c.queueIndex, queue: c.queue, partition: c.partition, streamId };
      return { at, letter: this.letter(at, fieldsOf(flat)) };
    });
    const last = entries.at(-1)?.[0];
    if (last !== undefined) c.start = `(${last}`;
    // Nothing comes after the largest id, and Redis refuses a range that starts after it.
    c.dry = entries.length < this.batch || last === LAST_STREAM_ID;
  }
}

/**
 * Every queue's and partition's dead-letter stream (OperatedQueues), for the
 * people who mend them (admin API and CLI), as one list: oldest first across
 * queues and partitions (ties by queue, then partition number), so a page's
 * last id is a cursor for the next.
 */
@Injectable()
export class DeadLetterQueue {
  private readonly batch: number;
  private readonly listExamine: number;

  constructor(
    @InjectRedis() private readonly redis: RedisClient,
    @Optional() private readonly queues: OperatedQueues = operatedQueues(),
    @Optional() @Inject(DEAD_LETTER_SCAN_SETTINGS) settings: DeadLetterScanSettings = {},
  ) {
    this.batch = settings.batch ?? SCAN_BATCH;
    this.listExamine = settings.listExamine ?? LIST_EXAMINE;
  }

  /**
   * Oldest first across queues and partitions; `after` is the previous page's
   * `next` (or its last id). Without a filter, `count` dead letters; with
   * one, up to `count` of the workflow among at most `listExamine` looked at.
   */
  list(count = 50, after?: string, filter: DeadLetterFilter = {}): Promise<DeadLetterPage> {
    const examine = filter.workflow === undefined ? count : Math.max(count, this.listExamine);
    return this.scan({ count, examine, after, filter });
  }

  /**
   * Up to `count` dead letters (of the filter's workflow) from after
   * `after`, looking at `examine` at most, and not past `until`.
   */
  async scan(options: {
    readonly examine: number;
    readonly count?: number;
    readonly after?: string;
    readonly filter?: DeadLetterFilter;
    readonly until?: DeadLetterBounds;
  }): Promise<DeadLetterPage> {
    const { examine, count = examine, after, filter = {}, until } = options;
    const walk = this.walk({ after, until, examine });
    const letters: DeadLetter[] = [];
    let last: string | undefined;
    for (let examined = 0; examined < examine && letters.length < count; examined++) {
      const letter = await walk.next();
      if (!letter) return { letters };
      last = letter.id;
      if (!matchesFilter(letter, filter)) continue;
      const { fields: _fields, ...plain } = letter;
      letters.push(plain);
    }
    return last !== undefined && (await walk.more()) ? { letters, next: last } : { letters };
  }

  /**
   * A walk from after `after` (a NoSuchQueueError or NoSuchPartitionError
   * when it names neither), not past `until`: what was dead-lettered after
   * those bounds were read (a re-drive that failed again at once) is not
   * walked. `examine`, when known, keeps the first reads as small as the walk.
   */
  walk(
    options: { readonly after?: string; readonly until?: DeadLetterBounds; readonly examine?: number } = {},
  ): DeadLetterWalk {
    const from = options.after === undefined ? undefined : this.locate(options.after);
    const batch = Math.max(1, Math.min(this.batch, (options.examine ?? this.batch) + 1));
    const cursors = this.streams().map((s): StreamCursor => {
      const end = options.until ? options.until.get(s.partition.dead) : '+';
      let start = '-';
      if (from) {
        // A stream up to the cursor's (by queue, then partition) resumes after its id; a later one at it.
        const exclusive =
          s.queueIndex < from.queueIndex ||
          (s.queueIndex === from.queueIndex && s.partition.index <= from.partition.index);
        start = exclusive ? `(${from.streamId}` : from.streamId;
        if (exclusive && from.streamId === LAST_STREAM_ID) return { ...s, start, end: '+', buffer: [], dry: true };
      }
      return { ...s, start, end: end ?? '+', buffer: [], dry: end === undefined };
    });
    return new DeadLetterWalk(this.redis, cursors, batch, (at, f) => this.letter(at, f));
  }

  /** Each dead-letter stream's newest id now: the bounds of a walk that must not chase its own re-drives. */
  async newest(): Promise<DeadLetterBounds> {
    const newest = await Promise.all(
      this.streams().map(async ({ partition }) => {
        const [entry] = await this.redis.xrevrange(partition.dead, '+', '-', 'COUNT', 1);
        return entry ? ([partition.dead, entry[0]] as const) : undefined;
      }),
    );
    return new Map(newest.filter((e) => e !== undefined));
  }

  /** One dead letter with every field; undefined when there is none with that id. */
  async inspect(id: string): Promise<DeadLetterDetail | undefined> {
    const at = this.locate(id);
    const [entry] = await this.redis.xrange(at.partition.dead, at.streamId, at.streamId);
    return entry && this.letter(at, fieldsOf(entry[1]));
  }

  /**
   * Dead letters in every queue and partition; of one workflow, each stream
   * read once, batch by batch (a dead letter names its workflow inside).
   */
  async length(filter: DeadLetterFilter = {}): Promise<number> {
    const streams = this.streams();
    if (filter.workflow === undefined) {
      const lengths = await Promise.all(streams.map(({ partition }) => this.redis.xlen(partition.dead)));
      return lengths.reduce((n, l) => n + l, 0);
    }
    const counts = await Promise.all(
      streams.map(async (s) => {
        let n = 0;
        for (let start = '-'; ;) {
          const entries = await this.redis.xrange(s.partition.dead, start, '+', 'COUNT', this.batch);
          for (const [streamId, flat] of entries) {
            if (matchesFilter(this.letter({ ...s, streamId }, fieldsOf(flat)), filter)) n++;
          }
          const last = entries.at(-1)?.[0];
          if (entries.length < this.batch || last === undefined || last === LAST_STREAM_ID) return n;
          start = `(${last}`;
        }
      }),
    );
    return counts.reduce((n, c) => n + c, 0);
  }

  /**
   * Back into its own queue's and partition's job stream; NoSuchQueueError or
   * NoSuchPartitionError when the id names neither.
   */
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
      [streamId, f.job_id, JOB_RECORD_TTL_MS, ...DEAD_LETTER_OWN_FIELDS],
    );
    const { id: deadLetter, workflow } = this.letter(at, f);
    return entryId ? { outcome: 'redriven', deadLetter, jobId: f.job_id, entryId, workflow } : { outcome: 'not_found' };
  }

  private streams(): Stream[] {
    return this.queues.all.flatMap((queue, queueIndex) =>
      queue.layout.partitions.map((partition) => ({ queueIndex, queue, partition })),
    );
  }

  /**
   * Where a dead-letter id (well formed: parseDeadLetterId) points:
   * `[<queue>/][<partition>:]<ms>-<seq>`, the partition named exactly when
   * there are several, the queue when it is not summaries (a `summaries/`
   * prefix is taken too; the answers give the id without it).
   */
  private locate(id: string): Located {
    const slash = id.indexOf('/');
    const queue = slash < 0 ? this.queues.default : this.queues.named(id.slice(0, slash));
    if (!queue) {
      const names = this.queues.all.map((q) => q.name).join(', ');
      throw new NoSuchQueueError(`no queue ${id.slice(0, slash)}: the queues are ${names}`);
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
      workflow: f.workflow ?? queue.workflow ?? queue.name,
      step: f.step,
      sourceId: f.source_id,
      reason: f.reason,
      detail: f.detail,
      jobId: f.job_id,
      tenant: f.tenant,
      deadLetteredAt: new Date(Number(streamId.split('-')[0])),
      fields: f,
    };
  }
}
