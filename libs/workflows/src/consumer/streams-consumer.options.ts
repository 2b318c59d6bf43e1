import { Inject } from '@nestjs/common';

/** One partition of the job stream, as the consumer sees it: its stream and its dead-letter stream (one hash slot). */
export interface ConsumerPartition {
  readonly index: number;
  readonly stream: string;
  readonly deadLetterStream: string;
}

/** One queue the consumer works: its partitions and its consumer group. */
export interface ConsumerQueue {
  /** What the handler is told an entry came from (EntrySource.queue). */
  readonly name: string;
  readonly group: string;
  /** Every partition, each read by its own loop on its own blocking connection; never empty. */
  readonly partitions: readonly ConsumerPartition[];
}

export interface StreamsConsumerOptions {
  /**
   * Every queue, all worked by this one consumer within one `concurrency`
   * (one SlotLimiter over all their partitions); never empty. The first
   * queue's loops keep the names they had when it was the only one
   * (`streams-consumer`, `streams-consumer:<i>`); another's are
   * `streams-consumer:<queue>[:<i>]`.
   */
  readonly queues: readonly ConsumerQueue[];
  /** Unique per process: a restarted pod is a new consumer, its old entries are reclaimed. */
  readonly consumer: string;
  /** Jobs in flight in this process, all queues and partitions together. */
  readonly concurrency: number;
  /** An entry idle this long belongs to a consumer that stopped refreshing it (dead). */
  readonly claimIdleMs: number;
  /** Deliveries allowed; the next claim dead-letters the entry. */
  readonly maxDeliveries: number;
  /** Time budget of one delivery. */
  readonly jobBudgetMs: number;
  /** XREADGROUP BLOCK. */
  readonly blockMs: number;
  /** How often in-flight entries get their idle time reset: well within claimIdleMs. */
  readonly refreshIntervalMs: number;
  /** How often a full XAUTOCLAIM scan starts over once one has finished. */
  readonly reclaimIntervalMs: number;
  /** On shutdown, how long in-flight jobs may take before their calls are cut off. */
  readonly drainTimeoutMs: number;
  /**
   * How long a partition's loop may go without a beat before liveness fails
   * (default: 30 s, or ten blocking reads if longer). A loop waiting for a
   * slot beats at least four times within it.
   */
  readonly loopSilenceMs?: number;
  /** Start the loop at application bootstrap (off in tests that drive runOnce). */
  readonly autoStart: boolean;
}

export const STREAMS_CONSUMER_OPTIONS = 'worker:streams-consumer-options';
export const InjectStreamsConsumerOptions = (): ParameterDecorator => Inject(STREAMS_CONSUMER_OPTIONS);
