import { Inject } from '@nestjs/common';
import type { ChainableCommander } from 'ioredis';

/** A stream entry as read: its id and its flat field list turned into a map. */
export interface StreamMessage {
  readonly id: string;
  readonly fields: Readonly<Record<string, string>>;
}

/** Where an entry was read: its queue (ConsumerQueue.name) and the partition whose stream held it. */
export interface EntrySource {
  readonly queue: string;
  readonly partition: number;
}

/** What the consumer gives one delivery besides its entry. */
export interface JobRunContext {
  readonly source: EntrySource;
  /** This delivery's number (1 first), as Redis counts it. */
  readonly delivery: number;
  /** Monotonic deadline of this delivery (JOB_BUDGET_S from its start). */
  readonly deadline: number;
  /** Aborted when shutdown begins: no new attempt, backoff sleeps end at once. */
  readonly stopRetrying: AbortSignal;
  /** Aborted when shutdown's drain time is over: the call in progress is cut off too. */
  readonly signal: AbortSignal;
  /**
   * Says that what this delivery waits on outside (its model calls) is done
   * and only its writes are left (a commit, the ack): the consumer gives its
   * slot to the next entry meanwhile (SlotLimiter.finishing), so a slow model
   * holds a slot for the call, not for the commit after it. Optional to call.
   */
  readonly workDone?: () => void;
}

/** An entry to add once a delivery is acked: its stream (in the acked entry's hash slot) and its flat fields. */
export interface NextEntry {
  readonly stream: string;
  readonly fields: readonly string[];
  /**
   * Adds it once per gate (HSETNX of `field` on the hash `key`, same hash slot; `ttlMs` if the hash is new), not
   * once per XACK: whichever delivery acks first, the one that committed the work still schedules what follows.
   */
  readonly gate: { readonly key: string; readonly field: string; readonly ttlMs: number };
}

/**
 * A delivery's result when acking it schedules more work: `next` (the next
 * step's entry) is added by the script that acks and deletes the entry, and
 * only if that ack acknowledged it, so that of two deliveries of one entry
 * (a redelivery, a reclaim while the first still ran) only one adds it. If
 * the script fails, the entry stays pending and is redelivered, as when a
 * plain ack fails.
 */
export interface DeliveryResult {
  readonly outcome: string;
  readonly next?: NextEntry;
}

/**
 * The work the consumer runs for each entry, in the shape of @nestjs/bullmq's
 * `WorkerHost.process(job)`. It resolves with a name for what it did (the
 * `outcome` of the job metrics, logged as `result`), or a DeliveryResult, and the entry is acked;
 * or it throws, and the error's class (failureOf) decides: retryable leaves
 * the entry pending for redelivery, anything else dead-letters it. It may run
 * more than once for one entry, so it must be idempotent.
 */
export interface JobHandler {
  process(message: StreamMessage, ctx: JobRunContext): Promise<string | DeliveryResult>;
  /**
   * Called when the consumer dead-letters an entry (a failure that is not
   * retryable, or one delivery too many), while it builds the MULTI that
   * copies the entry to the dead-letter stream, acks and deletes it: the
   * commands added to `tx` run in that same transaction, so they must only
   * name keys in the stream's hash slot: that of `source.partition` of
   * `source.queue`, whose stream the entry was read from. Synchronous: it
   * queues, never awaits.
   */
  deadLettered?(tx: ChainableCommander, message: StreamMessage, reason: string, source: EntrySource): void;
  /**
   * Called once the dead letter is written (the MULTI ran without an error
   * in its own commands; one that failed calls nothing): what must only
   * follow a dead letter that exists (the run counted failed). Not awaited:
   * what it does late it does on its own; an error it throws is only logged,
   * the dead letter stands.
   */
  afterDeadLetter?(message: StreamMessage, reason: string, source: EntrySource): void;
  /**
   * Called with each batch the consumer read or reclaimed, before it runs
   * them: where the handler can do for the batch at once what each delivery
   * would do alone (the summary job's pre-check: one query, not one each).
   * It must not throw, and a delivery must still run right without it.
   */
  prepare?(messages: readonly StreamMessage[], source: EntrySource): void;
  /** What every log line of a delivery carries besides its entry id (the summary job: its job id). */
  logFields?(message: StreamMessage): Readonly<Record<string, string | undefined>>;
}

/** The provider StreamsConsumer runs its entries with. */
export const JOB_HANDLER = 'worker:job-handler';
export const InjectJobHandler = (): ParameterDecorator => Inject(JOB_HANDLER);
