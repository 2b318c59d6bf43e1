import { BeforeApplicationShutdown, Injectable, Logger, OnApplicationBootstrap, OnModuleDestroy } from '@nestjs/common';
import { backoffDelay } from '@app/config';
import { HealthChecksRegistry } from '@app/health';
import { InjectRedis, type RedisClient } from '@app/redis';
import { PinoLogger } from 'nestjs-pino';
import { setTimeout as delay } from 'node:timers/promises';
import { failureOf } from '../jobs/job.errors';
import { WorkerMetrics } from '../worker.metrics';
import { ConsumerGroup } from './consumer-group';
import { InjectJobHandler, type JobHandler, type StreamMessage } from './job-handler';
import { LeaseManager } from './lease-manager';
import { SlotLimiter } from './slot-limiter';
import { InjectStreamsConsumerOptions, type StreamsConsumerOptions } from './streams-consumer.options';

/**
 * The handler's result (for the summary job, `done` or `duplicate`), or what
 * its error's class decided: retryable is `transient`, anything else `dead_lettered`.
 */
export type DeliveryOutcome = string;

export interface Delivery {
  readonly id: string;
  /** This delivery's number, as Redis counts it. */
  readonly deliveries: number;
  readonly outcome: Promise<DeliveryOutcome>;
}

const LOOP = 'streams-consumer';
/** After a failed turn the loop waits 100 ms, doubling up to 5 s. */
const TURN_BACKOFF = { baseMs: 100, capMs: 5000, jitter: 'none' } as const;

/**
 * Owns the loop on the job stream: reclaims entries that dead consumers left
 * (XAUTOCLAIM, with the cursor kept between turns), reads new ones
 * (XREADGROUP >) for as many free slots as it has, runs each with the
 * JOB_HANDLER, up to `concurrency` at once (SlotLimiter), while LeaseManager
 * keeps its in-flight entries fresh so no live job is taken from under it.
 * ConsumerGroup does the Redis side of each step; this class decides.
 * The handler's outcome decides: success acks; an error's class (failureOf)
 * leaves the entry pending for redelivery when it is retryable, and
 * dead-letters it at once when not; past maxDeliveries an entry is
 * dead-lettered without running. A job that finished but whose ack failed
 * stays pending: its redelivery stops at the handler's pre-check as a
 * duplicate.
 */
@Injectable()
export class StreamsConsumer implements OnApplicationBootstrap, BeforeApplicationShutdown, OnModuleDestroy {
  private readonly logger = new Logger(StreamsConsumer.name);
  /** The jobs in flight, by entry id. */
  private readonly slots: SlotLimiter<DeliveryOutcome>;
  private readonly leases: LeaseManager;
  /** Aborted when shutdown begins: no new retries, backoff sleeps end. */
  private readonly stopRetrying = new AbortController();
  /** Aborted when the drain time is over: calls in progress are cut off. */
  private readonly hardStop = new AbortController();
  private readonly group: ConsumerGroup;
  private cursor = '0-0';
  private nextReclaimAt = 0;
  private stopping = false;
  private loop: Promise<void> | undefined;

  constructor(
    @InjectRedis() redis: RedisClient,
    @InjectStreamsConsumerOptions() private readonly options: StreamsConsumerOptions,
    @InjectJobHandler() private readonly handler: JobHandler,
    private readonly health: HealthChecksRegistry,
    private readonly metrics: WorkerMetrics,
    private readonly pino: PinoLogger,
  ) {
    this.slots = new SlotLimiter(options.concurrency);
    this.leases = new LeaseManager(redis, options, () => this.slots.ids(), this.logger);
    this.group = new ConsumerGroup(redis, options, this.logger);
  }

  get consumerName(): string {
    return this.options.consumer;
  }

  get inFlightCount(): number {
    return this.slots.size;
  }

  onApplicationBootstrap(): void {
    this.leases.start();
    if (this.options.autoStart) this.start();
  }

  /** Starts the background loop (idempotent). */
  start(): void {
    if (this.loop || this.stopping) return;
    this.health.registerLoop(LOOP, Math.max(30_000, this.options.blockMs * 10));
    this.loop = this.run();
  }

  /**
   * One turn, for tests and tools: reclaim, read without blocking, and wait
   * for the jobs it started. Returns what each delivery came to.
   */
  async runOnce(): Promise<{ id: string; deliveries: number; outcome: DeliveryOutcome }[]> {
    this.leases.start();
    const started = await this.turn(false);
    return Promise.all(started.map(async (d) => ({ id: d.id, deliveries: d.deliveries, outcome: await d.outcome })));
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.stop();
  }

  onModuleDestroy(): void {
    // Tests that close the module without a shutdown still release the connection.
    if (!this.loop) this.group.disconnect();
  }

  /**
   * Stops reading, lets in-flight jobs finish (their acks included) for up to
   * drainTimeoutMs, then cuts their calls off; those stay pending and are
   * redelivered elsewhere. Resolves when nothing is in flight, after taking
   * this consumer out of the group if nothing is pending for it.
   */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.stopRetrying.abort(new Error('shutting down'));
    this.group.disconnect(); // ends a blocking XREADGROUP at once
    this.slots.wake();
    await this.loop;
    this.health.unregisterLoop(LOOP);
    if (this.slots.size > 0) {
      this.logger.log(`draining ${this.slots.size} in-flight job(s)`);
      const drained = await Promise.race([
        this.slots.settled().then(() => true),
        delay(this.options.drainTimeoutMs, false, { ref: false }),
      ]);
      if (!drained) {
        this.logger.warn(
          `drain timed out after ${this.options.drainTimeoutMs} ms; cutting ${this.slots.size} job(s) off`,
        );
        this.hardStop.abort(new Error('drain timed out'));
        await this.slots.settled();
      }
    }
    this.leases.stop();
    await this.forgetConsumer();
  }

  /** Each process is a new consumer: leave no name behind, unless entries still wait on it. */
  private async forgetConsumer(): Promise<void> {
    try {
      if ((await this.group.leave()) === 'pending')
        this.logger.log('entries are still pending for this consumer; it stays in the group for them to be reclaimed');
    } catch (err) {
      this.logger.warn(`could not remove this consumer from the group: ${(err as Error).message}`);
    }
  }

  private async run(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      this.health.beat(LOOP);
      try {
        await this.turn(true);
        failures = 0;
      } catch (err) {
        if (this.stopping) break;
        const backoffMs = backoffDelay(failures++, TURN_BACKOFF);
        this.logger.warn(`consumer turn failed, retrying in ${backoffMs} ms: ${(err as Error).message}`);
        // Shutdown ends the wait at once.
        await delay(backoffMs, undefined, { signal: this.stopRetrying.signal }).catch(() => undefined);
      }
    }
  }

  private async turn(block: boolean): Promise<Delivery[]> {
    try {
      return await this.turnOnce(block);
    } catch (err) {
      // The group is gone (Redis restarted without persistence, or someone
      // deleted it): create it again and carry on.
      if (!(err as Error).message?.includes('NOGROUP')) throw err;
      this.logger.warn('the consumer group is gone; creating it again');
      this.group.forgotten();
      this.cursor = '0-0';
      return this.turnOnce(block);
    }
  }

  private async turnOnce(block: boolean): Promise<Delivery[]> {
    await this.group.ensure();
    let free = this.slots.free;
    if (free <= 0) {
      await this.slots.slotFreed(1000);
      return [];
    }
    const started: Delivery[] = [];
    if (this.cursor !== '0-0' || performance.now() >= this.nextReclaimAt) {
      started.push(...(await this.reclaim(free)));
      free -= started.length;
      if (this.cursor === '0-0') this.nextReclaimAt = performance.now() + this.options.reclaimIntervalMs;
    }
    if (free > 0 && !this.stopping) {
      // Block only when there is nothing else to do: no reclaim scan under way.
      const wait = block && started.length === 0 && this.cursor === '0-0';
      const messages = await this.group.readNew(free, wait);
      this.prepare(messages);
      for (const message of messages) started.push(this.dispatch(message, 1));
    }
    return started;
  }

  private async reclaim(count: number): Promise<Delivery[]> {
    const { cursor, entries, deleted } = await this.group.reclaim(this.cursor, count);
    this.cursor = cursor;
    for (const id of deleted) {
      // Gone from the stream while pending: XAUTOCLAIM dropped it from the
      // group and the script recorded it in the dead-letter stream.
      this.metrics.deadLetters.inc({ reason: 'deleted_from_stream' });
      this.logger.error(
        { entry: id },
        'a pending entry was deleted from the stream; recorded in the dead-letter stream',
      );
    }
    const started: Delivery[] = [];
    this.prepare(entries.filter((e) => !this.slots.has(e.message.id)).map((e) => e.message));
    for (const { message, deliveries } of entries) {
      const { id } = message;
      // Still running here: its refresh came too late (a stalled event loop,
      // a failed REFRESH) and the claim has just reset its idle time, which is
      // all it needed (at the cost of one delivery counted). Running it again
      // would run the job twice in this process and take a second slot.
      if (this.slots.has(id)) continue;
      this.metrics.reclaimed.inc();
      if (deliveries > this.options.maxDeliveries) {
        try {
          await this.deadLetter(message, 'max_deliveries', `delivered ${deliveries - 1} times without success`);
        } catch (err) {
          // Still pending, claimed by us: the next claim tries again. The rest
          // of the batch, claimed with it, must still run.
          this.logger.error(
            { ...this.logFields(message), entry: id, deliveries },
            `dead-lettering failed: ${(err as Error).message}`,
          );
        }
        continue;
      }
      this.logger.log({ ...this.logFields(message), entry: id, deliveries }, 'reclaimed');
      started.push(this.dispatch(message, deliveries));
    }
    return started;
  }

  private dispatch(message: StreamMessage, deliveries: number): Delivery {
    // Every log line of the job, however deep, carries its entry and what the handler names it by.
    const bindings = { ...this.logFields(message), entry: message.id };
    const outcome = this.slots.hold(
      message.id,
      this.pino.runInContext(() => this.process(message, deliveries), { bindings }),
    );
    return { id: message.id, deliveries, outcome };
  }

  private async process(message: StreamMessage, deliveries: number): Promise<DeliveryOutcome> {
    const startedAt = performance.now();
    const finish = (outcome: DeliveryOutcome): DeliveryOutcome => {
      this.metrics.jobs.inc({ outcome });
      this.metrics.jobDuration.observe({ outcome }, (performance.now() - startedAt) / 1000);
      return outcome;
    };
    const named = { ...this.logFields(message), entry: message.id, deliveries };
    let result: DeliveryOutcome;
    try {
      result = await this.handler.process(message, {
        deadline: performance.now() + this.options.jobBudgetMs,
        stopRetrying: this.stopRetrying.signal,
        signal: this.hardStop.signal,
      });
    } catch (err) {
      const { kind: reason, retryable } = failureOf(err);
      if (retryable) {
        // Left pending and no longer refreshed: redelivered after claimIdleMs.
        this.logger.warn({ ...named, reason }, `job failed, will be redelivered: ${(err as Error).message}`);
        return finish('transient');
      }
      this.logger.error({ ...named, reason }, `job failed for good: ${(err as Error).message}`);
      try {
        await this.deadLetter(message, reason, (err as Error).message);
      } catch (dlqErr) {
        // Still pending: it comes back and ends here again, or past maxDeliveries.
        this.logger.error(named, `dead-lettering failed: ${(dlqErr as Error).message}`);
        return finish('transient');
      }
      return finish('dead_lettered');
    }
    try {
      await this.group.ack(message.id);
    } catch (err) {
      // The job is done and committed; only the ack is in doubt (a timeout
      // may even come after Redis ran it). Dead-lettering it would mark a
      // finished job failed. Left pending, it is redelivered after
      // claimIdleMs, stops at the handler's pre-check as a duplicate and is
      // acked then; if the ack did run, nothing is left to redeliver.
      this.logger.warn(
        { ...named, result },
        `job finished but its ack failed, left pending: ${(err as Error).message}`,
      );
      return finish('transient');
    }
    this.logger.log({ deliveries, result }, 'job finished');
    return finish(result);
  }

  /** Dead-letters the entry in one MULTI, with the handler's own commands for it (deadLettered). */
  private async deadLetter(message: StreamMessage, reason: string, detail: string): Promise<void> {
    const hook = this.handler.deadLettered?.bind(this.handler);
    await this.group.deadLetter(message, reason, detail, hook && ((tx) => hook(tx, message, reason)));
    this.metrics.deadLetters.inc({ reason });
  }

  /**
   * Lets the handler prepare a batch before its deliveries run (JobHandler.prepare); a failure there is only logged.
   */
  private prepare(messages: readonly StreamMessage[]): void {
    if (messages.length === 0 || !this.handler.prepare) return;
    try {
      this.handler.prepare(messages);
    } catch (err) {
      this.logger.warn(`preparing a batch of ${messages.length} failed: ${(err as Error).message}`);
    }
  }

  /** What the handler names a delivery by in the logs (the summary job: its job id). */
  private logFields(message: StreamMessage): Readonly<Record<string, string | undefined>> {
    return this.handler.logFields?.(message) ?? {};
  }
}
