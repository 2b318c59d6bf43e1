import type { RedisClient } from '@app/redis';
import type { LoggerService } from '@nestjs/common';
import { REFRESH } from './stream-scripts';
import type { ConsumerPartition, ConsumerQueue, StreamsConsumerOptions } from './streams-consumer.options';

/** One partition's stream: each partition's in-flight entries are refreshed in their own stream. */
export type LeaseOptions = Pick<ConsumerPartition, 'stream'> &
  Pick<ConsumerQueue, 'group'> &
  Pick<StreamsConsumerOptions, 'consumer' | 'refreshIntervalMs'>;

/**
 * Keeps this consumer's in-flight entries its own, as BullMQ's LockManager
 * keeps its jobs' locks: every refreshIntervalMs, REFRESH resets the idle
 * time of the entries `held()` names, so no other consumer's XAUTOCLAIM takes
 * a live job. A failed refresh is logged and the next one tries again. An
 * entry it stops naming (its job ended, retryable failures included) ages
 * until claimIdleMs and is redelivered.
 */
export class LeaseManager {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: RedisClient,
    private readonly options: LeaseOptions,
    private readonly held: () => readonly string[],
    private readonly logger: LoggerService,
  ) {}

  /** Starts refreshing (idempotent); the timer does not keep the process alive. */
  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.refresh(), this.options.refreshIntervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  async refresh(): Promise<void> {
    const ids = this.held();
    if (ids.length === 0) return;
    try {
      await REFRESH.run(this.redis, [this.options.stream], [this.options.group, this.options.consumer, ...ids]);
    } catch (err) {
      this.logger.warn(`could not refresh in-flight entries: ${(err as Error).message}`);
    }
  }
}
