import { duplicateForBlocking, type RedisClient } from '@app/redis';
import type { Logger } from '@nestjs/common';
import { MicroBatcher } from '@app/batching';
import type { ChainableCommander } from 'ioredis';
import { DEAD_LETTER_OWN_FIELDS } from '../dead-letter-fields';
import { entryFieldMap } from '../wire';
import type { NextEntry, StreamMessage } from './job-handler';
import { ABANDON, ACK, ACK_THEN_ADD, FORGET_CONSUMER, RECLAIM } from './stream-scripts';
import type { ConsumerPartition, ConsumerQueue, StreamsConsumerOptions } from './streams-consumer.options';

/** Dead letters are kept, but not without bound. */
const DEAD_LETTER_MAXLEN = 100_000;
/** A consumer runs at most a few dozen jobs at once; this bounds one script's argument list. */
const MAX_ACKS_PER_CALL = 256;
/** XADD to the dead-letter stream, XACK, XDEL: the MULTI's own commands, before the handler's. */
const DEAD_LETTER_COMMANDS = 3;

type RawEntry = [string, string[]];

export type GroupOptions = Pick<ConsumerPartition, 'stream' | 'deadLetterStream'> &
  Pick<ConsumerQueue, 'group'> &
  Pick<StreamsConsumerOptions, 'consumer' | 'claimIdleMs' | 'blockMs'> & {
    /** CLIENT SETNAME of the blocking connection; `<consumer>:blocking` unless given. */
    readonly blockingName?: string;
  };

/** What one reclaim step found: entries to run again with their delivery counts, and ids gone from the stream. */
export interface Reclaimed {
  /** XAUTOCLAIM's cursor: '0-0' once the scan of the pending entries is over. */
  readonly cursor: string;
  readonly entries: readonly { readonly message: StreamMessage; readonly deliveries: number }[];
  /** Pending ids whose entries were deleted from the stream, recorded in the dead-letter stream by the script. */
  readonly deleted: readonly string[];
}

/**
 * One stream's consumer group as this consumer sees it in Redis: creating
 * the group, reading new entries (blocking on a connection of its own),
 * reclaiming what dead consumers left, acknowledging, dead-lettering, and
 * leaving the group. No policy: StreamsConsumer decides what to do when.
 */
export class ConsumerGroup {
  private blocking: RedisClient | undefined;
  private ready = false;
  /** A failed call fails every ack in it: each job is left pending, as when its own ack fails. */
  private readonly acks = new MicroBatcher<string, void>({
    run: async (ids) => {
      await ACK.run(this.redis, [this.options.stream], [this.options.group, ...ids]);
      return ids.map(() => undefined);
    },
    maxBatch: MAX_ACKS_PER_CALL,
    maxInFlight: 2,
  });

  constructor(
    private readonly redis: RedisClient,
    private readonly options: GroupOptions,
    private readonly logger: Logger,
  ) {}

  /** Creates the group (and the stream) once; after a NOGROUP, `forgotten()` makes the next call create it again. */
  async ensure(): Promise<void> {
    if (this.ready) return;
    try {
      // From 0, not $: jobs accepted before any worker existed are delivered too.
      await this.redis.xgroup('CREATE', this.options.stream, this.options.group, '0', 'MKSTREAM');
    } catch (err) {
      if (!(err as Error).message.startsWith('BUSYGROUP')) throw err;
    }
    this.ready = true;
  }

  /** The group is gone (Redis restarted without persistence, or someone deleted it). */
  forgotten(): void {
    this.ready = false;
  }

  /**
   * XAUTOCLAIM from `cursor` plus each entry's delivery count, in one script
   * (RECLAIM); counts come from Redis, never from this process's memory.
   */
  async reclaim(cursor: string, count: number): Promise<Reclaimed> {
    const [next, entries, deleted, counts] = await RECLAIM.run<[string, RawEntry[], string[], number[]]>(
      this.redis,
      [this.options.stream, this.options.deadLetterStream],
      [this.options.group, this.options.consumer, this.options.claimIdleMs, cursor, count, DEAD_LETTER_MAXLEN],
    );
    return {
      cursor: next,
      entries: entries.map(([id, flat], i) => ({
        message: { id, fields: entryFieldMap(flat) },
        deliveries: Number(counts[i]),
      })),
      deleted,
    };
  }

  /** Up to `count` new entries (XREADGROUP >); `block`: waits up to blockMs for one, on the blocking connection. */
  async readNew(count: number, block: boolean): Promise<StreamMessage[]> {
    const client = block ? this.blockingClient() : this.redis;
    const args: (string | number)[] = ['GROUP', this.options.group, this.options.consumer, 'COUNT', count];
    if (block) args.push('BLOCK', this.options.blockMs);
    args.push('STREAMS', this.options.stream, '>');
    const xreadgroup = client.xreadgroup.bind(client) as (...a: (string | number)[]) => Promise<unknown>;
    const reply = (await xreadgroup(...args)) as [string, RawEntry[]][] | null;
    return (reply?.[0]?.[1] ?? []).map(([id, flat]) => ({ id, fields: entryFieldMap(flat) }));
  }

  /**
   * Acknowledges and deletes the entry (ACK): the stream holds only work not
   * done. The acks of jobs that finish together go in one script call.
   */
  ack(id: string): Promise<void> {
    return this.acks.submit(id);
  }

  /**
   * Acknowledges and deletes the entry and adds `next` once per its gate (one
   * script, ACK_THEN_ADD): of two deliveries of one entry, only the first to
   * reach the gate schedules what follows, whether or not its XACK took the
   * entry. Not batched: each such ack has its own entry to add. Throws when
   * the script failed (the entry may then still be pending: it is
   * redelivered). Resolves with whether this XACK acknowledged the entry and
   * whether this call added `next`.
   */
  async ackThenAdd(id: string, next: NextEntry): Promise<{ acked: boolean; added: boolean }> {
    const [acked, added] = await ACK_THEN_ADD.run<[number, number]>(
      this.redis,
      [this.options.stream, next.stream, next.gate.key],
      [this.options.group, id, next.gate.field, next.gate.ttlMs, ...next.fields],
    );
    return { acked: Number(acked) === 1, added: Number(added) === 1 };
  }

  /**
   * Copies the entry to the dead-letter stream with its fields, a reason and
   * its source id, acknowledges and deletes it: one MULTI/EXEC. `alsoInTx`
   * adds the job's own commands (its record marked failed) to the same MULTI
   * (their keys share the stream's hash slot). A faulty hook cannot keep an
   * entry from ever leaving the stream: if it throws, or Redis refuses a
   * command it queued (EXECABORT), the entry is dead-lettered without them;
   * if one of its commands fails as it runs, the dead letter stands and the
   * failure is logged. Either way the error is logged.
   */
  async deadLetter(
    message: StreamMessage,
    reason: string,
    detail: string,
    alsoInTx?: (tx: ChainableCommander) => void,
  ): Promise<void> {
    const build = (withHook: boolean): ChainableCommander => {
      const fields = Object.entries(message.fields)
        .filter(([k]) => !DEAD_LETTER_OWN_FIELDS.includes(k))
        .flat();
      const tx = this.redis
        .multi()
        .xadd(
          this.options.deadLetterStream,
          'MAXLEN',
          '~',
          DEAD_LETTER_MAXLEN,
          '*',
          ...fields,
          'reason',
          reason,
          'detail',
          detail.slice(0, 1000),
          'source_id',
          message.id,
        )
        .xack(this.options.stream, this.options.group, message.id)
        .xdel(this.options.stream, message.id);
      if (withHook) alsoInTx?.(tx);
      return tx;
    };
    const withoutHook = (err: unknown): ChainableCommander => {
      this.logger.error(
        `the handler's dead-letter commands failed (${(err as Error).message}); ` +
          `entry ${message.id} dead-lettered without them`,
      );
      return build(false);
    };
    let tx: ChainableCommander;
    try {
      tx = build(true);
    } catch (err) {
      tx = withoutHook(err);
    }
    let results: [Error | null, unknown][] | null;
    try {
      results = await tx.exec();
    } catch (err) {
      // EXECABORT: RedisClient refused a queued command and ran none; the hook's, when ours are well formed.
      if (!alsoInTx || !(err as Error).message?.startsWith('EXECABORT')) throw err;
      results = await withoutHook(err).exec();
    }
    if (!results) throw new Error('MULTI aborted');
    // The first three are the dead letter itself; any after them are the hook's.
    const failed = results.slice(0, DEAD_LETTER_COMMANDS).find(([e]) => e);
    if (failed) throw failed[0] ?? new Error('a dead-letter command failed');
    const hookFailed = results.slice(DEAD_LETTER_COMMANDS).find(([e]) => e);
    if (hookFailed)
      this.logger.error(
        `the handler's dead-letter commands failed in Redis (${hookFailed[0]?.message}); entry ${message.id} ` +
          'is dead-lettered all the same',
      );
  }

  /**
   * Hands back an entry this consumer read but never ran (shutdown came
   * first): its delivery count back to what it was before the read, and idle
   * long enough that the next reclaim anywhere takes it at once (XCLAIM to
   * itself with RETRYCOUNT and IDLE, JUSTID: no delivery counted). `idleMs`
   * 0 hands it back to be reclaimed after the usual claimIdleMs instead.
   */
  async abandon(id: string, idleMs = this.options.claimIdleMs): Promise<void> {
    await ABANDON.run(this.redis, [this.options.stream], [this.options.group, this.options.consumer, id, idleMs]);
  }

  /** Leaves the group unless entries are still pending for this consumer (they must stay to be reclaimed). */
  async leave(): Promise<'left' | 'pending' | 'never-joined'> {
    if (!this.ready) return 'never-joined'; // never read: RedisClient has no such consumer
    const removed = await FORGET_CONSUMER.run<number>(
      this.redis,
      [this.options.stream],
      [this.options.group, this.options.consumer],
    );
    return removed ? 'left' : 'pending';
  }

  /** Closes the blocking connection, which ends a blocking read at once. */
  disconnect(): void {
    this.blocking?.disconnect();
  }

  private blockingClient(): RedisClient {
    // Its own connection: a blocking read must not hold up acks and refreshes.
    if (!this.blocking) {
      // It blocks: nothing may be batched behind it (the shared client is auto-pipelined).
      this.blocking = duplicateForBlocking(this.redis, {
        connectionName: this.options.blockingName ?? `${this.options.consumer}:blocking`,
        commandTimeout: this.options.blockMs + 5000,
      });
      this.blocking.on('error', (err: Error) => this.logger.debug(`blocking connection: ${err.message}`));
    }
    return this.blocking;
  }
}
