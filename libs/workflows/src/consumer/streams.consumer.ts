import { BeforeApplicationShutdown, Injectable, Logger, OnApplicationBootstrap, OnModuleDestroy } from '@nestjs/common';
import { backoffDelay } from '@app/config';
import { HealthChecksRegistry } from '@app/health';
import { InjectRedis, type RedisClient } from '@app/redis';
import { inSpanFrom, setOutcome, SpanKind } from '@app/tracing';
import { PinoLogger } from 'nestjs-pino';
import { setMaxListeners } from 'node:events';
import { setTimeout as delay } from 'node:timers/promises';
import { failureOf, HandBackError } from './job.errors';
import { stepEntryTraceparent } from '../wire';
import { WorkerMetrics } from '../worker.metrics';
import { ConsumerGroup } from './consumer-group';
import { type EntrySource, InjectJobHandler, type JobHandler, type StreamMessage } from './job-handler';
import { LeaseManager } from './lease-manager';
import { runOnceShares } from './run-once-shares';
import { SlotLimiter, type SlotReservation } from './slot-limiter';
import { InjectStreamsConsumerOptions, type StreamsConsumerOptions } from './streams-consumer.options';
import type { DeliveryResult } from './job-handler';

/**
 * The handler's result (for the summary job, `done` or `duplicate`), or what
 * its error's class decided: retryable is `transient`, anything else `dead_lettered`.
 */
export type DeliveryOutcome = string;

/**
 * The outcomes of a delivery that failed: left for redelivery, or dead-lettered. The handler's own (`done`, and
 * `duplicate` for work another delivery had committed) are not failures.
 */
const FAILED_OUTCOMES: ReadonlySet<DeliveryOutcome> = new Set(['transient', 'dead_lettered']);

export interface Delivery {
  readonly id: string;
  /** This delivery's number, as Redis counts it. */
  readonly deliveries: number;
  readonly outcome: Promise<DeliveryOutcome>;
}

const LOOP = 'streams-consumer';
/** After a failed turn the loop waits 100 ms, doubling up to 5 s. */
const TURN_BACKOFF = { baseMs: 100, capMs: 5000, jitter: 'none' } as const;

/** One partition's stream as this consumer works it: its group, leases, reclaim cursor and loop. */
interface PartitionState {
  /** Its queue's name and its index there: what the handler is told (EntrySource). */
  readonly source: EntrySource;
  readonly index: number;
  /** Its stream's key and its queue's consumer group: what a delivery's span names. */
  readonly stream: string;
  readonly consumerGroup: string;
  /** Its loop's name for the liveness check. */
  readonly loopName: string;
  readonly group: ConsumerGroup;
  readonly leases: LeaseManager;
  /** Its entries in flight here, by stream id (what its leases refresh). */
  readonly inFlight: Set<string>;
  cursor: string;
  nextReclaimAt: number;
  /** Its last read came back empty: the next blocking read asks for one entry only. */
  idle: boolean;
  loop?: Promise<void>;
}

/**
 * Owns the loops on the job stream's partitions, one per partition, each with
 * its own blocking connection: reclaims entries that dead consumers left
 * (XAUTOCLAIM, with the partition's cursor kept between turns), reads new ones
 * (XREADGROUP >) for the slots it could reserve, runs each with the
 * JOB_HANDLER, up to `concurrency` at once over all partitions (one
 * SlotLimiter), while each partition's LeaseManager keeps its in-flight
 * entries fresh so no live job is taken from under it. A loop reserves at
 * most its fair share (`ceil(concurrency / partitions)`) a read; once a read
 * came back empty it blocks for one entry only, so an idle partition holds at
 * most one slot while busy ones use the rest.
 * ConsumerGroup does the Redis side of each step; this class decides.
 * The handler's outcome decides: success acks; an error's class (failureOf)
 * leaves the entry pending for redelivery when it is retryable, and
 * dead-letters it at once when not; past maxDeliveries an entry is
 * dead-lettered without running. A job that finished but whose ack failed
 * stays pending: its redelivery stops at the handler's pre-check as a
 * duplicate. Acks, dead letters and leases go to the entry's own partition.
 */
@Injectable()
export class StreamsConsumer implements OnApplicationBootstrap, BeforeApplicationShutdown, OnModuleDestroy {
  private readonly logger = new Logger(StreamsConsumer.name);
  /** The jobs in flight, by partition and entry id. */
  private readonly slots: SlotLimiter<DeliveryOutcome>;
  /** Aborted when shutdown begins: no new retries, backoff sleeps end. */
  private readonly stopRetrying = new AbortController();
  /**
   * Aborted when the drain time is over: calls in progress are cut off. Each
   * delivery listens on it until its commit (up to twice WORKER_CONCURRENCY
   * deliveries: the running and the committing), so it warns of a leak only
   * past three times WORKER_CONCURRENCY listeners (set in the constructor).
   */
  private readonly hardStop = new AbortController();
  private readonly partitions: readonly PartitionState[];
  /** The most slots one read may reserve. */
  private readonly share: number;
  private stopping = false;
  private started = false;
  /** How long a loop may go without a beat before liveness fails. */
  private readonly silenceMs: number;
  /** The longest a loop waits for a slot before it beats and looks again: well within silenceMs. */
  private readonly slotWaitMs: number;

  constructor(
    @InjectRedis() redis: RedisClient,
    @InjectStreamsConsumerOptions() private readonly options: StreamsConsumerOptions,
    @InjectJobHandler() private readonly handler: JobHandler,
    private readonly health: HealthChecksRegistry,
    private readonly metrics: WorkerMetrics,
    private readonly pino: PinoLogger,
  ) {
    const total = options.queues.reduce((n, q) => n + q.partitions.length, 0);
    if (total === 0 || options.queues.some((q) => q.partitions.length === 0))
      throw new RangeError('the consumer needs at least one queue, each with at least one partition');
    this.slots = new SlotLimiter(options.concurrency);
    setMaxListeners(Math.max(10, options.concurrency * 3), this.hardStop.signal);
    this.silenceMs = options.loopSilenceMs ?? Math.max(30_000, options.blockMs * 10);
    this.slotWaitMs = Math.min(1000, Math.max(1, Math.floor(this.silenceMs / 4)));
    this.share = Math.ceil(options.concurrency / total);
    this.partitions = options.queues.flatMap((queue, q) =>
      queue.partitions.map((partition) => {
        const inFlight = new Set<string>();
        const { consumer, claimIdleMs, blockMs, refreshIntervalMs } = options;
        // The first queue's names stay as they were when it was the only one.
        const named = q === 0 ? '' : `:${queue.name}`;
        const numbered = queue.partitions.length === 1 ? '' : `:${partition.index}`;
        const lease = { stream: partition.stream, group: queue.group, consumer, refreshIntervalMs };
        const group = {
          stream: partition.stream,
          deadLetterStream: partition.deadLetterStream,
          group: queue.group,
          consumer,
          claimIdleMs,
          blockMs,
          // CLIENT SETNAME: `<consumer>:blocking[:<i>]` for the first queue, `<consumer>:<queue>:blocking[:<i>]` else.
          blockingName: `${consumer}${named}:blocking${numbered}`,
        };
        return {
          source: { queue: queue.name, partition: partition.index },
          index: partition.index,
          stream: partition.stream,
          consumerGroup: queue.group,
          loopName: `${LOOP}${named}${numbered}`,
          group: new ConsumerGroup(redis, group, this.logger),
          leases: new LeaseManager(redis, lease, () => [...inFlight], this.logger),
          inFlight,
          cursor: '0-0',
          nextReclaimAt: 0,
          idle: false,
        };
      }),
    );
  }

  get consumerName(): string {
    return this.options.consumer;
  }

  get inFlightCount(): number {
    return this.slots.size;
  }

  onApplicationBootstrap(): void {
    this.startLeases();
    if (this.options.autoStart) this.start();
  }

  /** Starts one background loop per partition (idempotent). */
  start(): void {
    if (this.started || this.stopping) return;
    this.started = true;
    for (const p of this.partitions) {
      // Every partition's loop beats on its own: one stuck partition fails liveness.
      this.health.registerLoop(p.loopName, this.silenceMs);
      p.loop = this.run(p);
    }
  }

  /**
   * One turn on every partition, for tests and tools: reclaim, read without
   * blocking, and wait for the jobs it started. Returns what each delivery came to.
   */
  async runOnce(): Promise<{ id: string; deliveries: number; outcome: DeliveryOutcome }[]> {
    this.startLeases();
    // Every partition's turn at once, as the loops would, each with its part of the slots free now (runOnceShares):
    // one partition's read does not wait for another's jobs.
    const shares = runOnceShares(this.slots.free, this.partitions.length);
    const started = (await Promise.all(this.partitions.map((p, i) => this.turn(p, false, shares[i])))).flat();
    return Promise.all(started.map(async (d) => ({ id: d.id, deliveries: d.deliveries, outcome: await d.outcome })));
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.stop();
  }

  onModuleDestroy(): void {
    // Tests that close the module without a shutdown still release the connections.
    if (!this.started) for (const p of this.partitions) p.group.disconnect();
  }

  /**
   * Stops reading, lets in-flight jobs finish (their acks included) for up to
   * drainTimeoutMs, then cuts their calls off; those stay pending and are
   * redelivered elsewhere. Resolves when nothing is in flight, after taking
   * this consumer out of each partition's group if nothing is pending for it there.
   */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.stopRetrying.abort(new Error('shutting down'));
    for (const p of this.partitions) p.group.disconnect(); // ends each blocking XREADGROUP at once
    this.slots.wake();
    await Promise.all(this.partitions.map((p) => p.loop ?? Promise.resolve()));
    for (const p of this.partitions) if (p.loop) this.health.unregisterLoop(p.loopName);
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
    for (const p of this.partitions) p.leases.stop();
    await Promise.all(this.partitions.map((p) => this.forgetConsumer(p)));
  }

  private startLeases(): void {
    for (const p of this.partitions) p.leases.start();
  }

  /** Each process is a new consumer: leave no name behind, unless entries still wait on it. */
  private async forgetConsumer(p: PartitionState): Promise<void> {
    try {
      if ((await p.group.leave()) === 'pending')
        this.logger.log(
          `entries are still pending for this consumer${this.where(p)}; it stays in the group for them to be reclaimed`,
        );
    } catch (err) {
      this.logger.warn(`could not remove this consumer from the group${this.where(p)}: ${(err as Error).message}`);
    }
  }

  /** ` in partition <i>` (of queue <q>) when there are several, for log lines. */
  private where(p: PartitionState): string {
    if (this.partitions.length === 1) return '';
    return this.options.queues.length === 1
      ? ` in partition ${p.index}`
      : ` in partition ${p.index} of queue ${p.source.queue}`;
  }

  private async run(p: PartitionState): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      this.health.beat(p.loopName);
      try {
        await this.turn(p, true);
        failures = 0;
      } catch (err) {
        if (this.stopping) break;
        const backoffMs = backoffDelay(failures++, TURN_BACKOFF);
        this.logger.warn(
          `consumer turn failed${this.where(p)}, retrying in ${backoffMs} ms: ${(err as Error).message}`,
        );
        // Shutdown ends the wait at once.
        await delay(backoffMs, undefined, { signal: this.stopRetrying.signal }).catch(() => undefined);
      }
    }
  }

  /** `max`: the most slots its read may reserve (a loop's: its fair share; runOnce's: its part of the free ones). */
  private async turn(p: PartitionState, block: boolean, max = this.share): Promise<Delivery[]> {
    try {
      return await this.turnOnce(p, block, max);
    } catch (err) {
      // The group is gone (Redis restarted without persistence, or someone
      // deleted it): create it again and carry on.
      if (!(err as Error).message?.includes('NOGROUP')) throw err;
      this.logger.warn(`the consumer group is gone${this.where(p)}; creating it again`);
      p.group.forgotten();
      p.cursor = '0-0';
      return this.turnOnce(p, block, max);
    }
  }

  private async turnOnce(p: PartitionState, block: boolean, max: number): Promise<Delivery[]> {
    await p.group.ensure();
    // Reserved before the read, so that the partitions' reads together never exceed the slots. Turns are for the
    // loops, which compete; runOnce's turns run side by side, once, each within its share of the slots that were
    // free when it began, and take no place in that queue.
    let slots = this.slots.reserve(max, block ? p : undefined);
    // Only when fewer slots were free than partitions (each still gets one), or running loops took them meanwhile,
    // does a runOnce turn find none left: it waits for one to free, so that each partition does get its turn.
    while (!block && slots.remaining <= 0 && !this.stopping) {
      await this.slots.slotFreed(this.slotWaitMs);
      slots = this.slots.reserve(max);
    }
    if (slots.remaining <= 0) {
      if (!this.stopping) await this.slots.slotFreed(this.slotWaitMs);
      return [];
    }
    try {
      const started: Delivery[] = [];
      if (p.cursor !== '0-0' || performance.now() >= p.nextReclaimAt) {
        started.push(...(await this.reclaim(p, slots)));
        if (p.cursor === '0-0') p.nextReclaimAt = performance.now() + this.options.reclaimIntervalMs;
      }
      if (slots.remaining > 0 && !this.stopping) {
        // Block only when there is nothing else to do: no reclaim scan under way. With several partitions (of one
        // queue or of several), only one whose last read found nothing blocks, for one entry, and without holding
        // a slot: the slots stay free for the busy partitions however many partitions are idle, and once it has an
        // entry its next read (not blocking) takes its share.
        const several = this.partitions.length > 1;
        const wait = block && started.length === 0 && p.cursor === '0-0' && (!several || p.idle);
        if (wait && several) {
          slots.release();
          const messages = await p.group.readNew(1, true);
          p.idle = messages.length === 0;
          started.push(...(await this.dispatchWhenFree(p, messages)));
        } else {
          const messages = await p.group.readNew(slots.remaining, wait);
          p.idle = messages.length === 0;
          this.prepare(p, messages);
          for (const message of messages) started.push(this.dispatch(p, slots, message, 1));
        }
      }
      return started;
    } finally {
      slots.release();
    }
  }

  /**
   * Runs what a blocking read returned without a slot held for it, each entry as soon as a slot is free (taking
   * its turn among the partitions). Meanwhile its lease is refreshed, as a running entry's is, and the partition's
   * loop beats: a worker whose slots are all busy is loaded, not stuck. On shutdown an entry still waiting is left
   * pending for another consumer, without this delivery counted against it (ConsumerGroup.abandon).
   */
  private async dispatchWhenFree(p: PartitionState, messages: readonly StreamMessage[]): Promise<Delivery[]> {
    if (messages.length === 0) return [];
    for (const m of messages) p.inFlight.add(m.id);
    this.prepare(p, messages);
    const started: Delivery[] = [];
    for (const message of messages) {
      let slot = this.slots.reserve(1, p);
      while (slot.remaining === 0 && !this.stopping) {
        this.health.beat(p.loopName);
        await this.slots.slotFreed(this.slotWaitMs);
        slot = this.slots.reserve(1, p);
      }
      if (this.stopping) {
        slot.release();
        p.inFlight.delete(message.id);
        await p.group
          .abandon(message.id)
          .catch((err: unknown) =>
            this.logger.warn(`could not hand back entry ${message.id}${this.where(p)}: ${(err as Error).message}`),
          );
        continue;
      }
      started.push(this.dispatch(p, slot, message, 1));
      slot.release();
    }
    return started;
  }

  private async reclaim(p: PartitionState, slots: SlotReservation<DeliveryOutcome>): Promise<Delivery[]> {
    const { cursor, entries, deleted } = await p.group.reclaim(p.cursor, slots.remaining);
    p.cursor = cursor;
    for (const id of deleted) {
      // Gone from the stream while pending: XAUTOCLAIM dropped it from the
      // group and the script recorded it in the dead-letter stream.
      this.metrics.deadLetters.inc({ reason: 'deleted_from_stream' });
      this.logger.error(
        { entry: id, ...this.partitionField(p) },
        'a pending entry was deleted from the stream; recorded in the dead-letter stream',
      );
    }
    const started: Delivery[] = [];
    this.prepare(
      p,
      entries.filter((e) => !p.inFlight.has(e.message.id)).map((e) => e.message),
    );
    for (const { message, deliveries } of entries) {
      const { id } = message;
      // Still running here: its refresh came too late (a stalled event loop,
      // a failed REFRESH) and the claim has just reset its idle time, which is
      // all it needed (at the cost of one delivery counted). Running it again
      // would run the job twice in this process and take a second slot.
      if (p.inFlight.has(id)) continue;
      this.metrics.reclaimed.inc();
      if (deliveries > this.options.maxDeliveries) {
        try {
          await this.deadLetter(p, message, 'max_deliveries', `delivered ${deliveries - 1} times without success`);
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
      started.push(this.dispatch(p, slots, message, deliveries));
    }
    return started;
  }

  private dispatch(
    p: PartitionState,
    slots: SlotReservation<DeliveryOutcome>,
    message: StreamMessage,
    deliveries: number,
  ): Delivery {
    // Every log line of the job, however deep, carries its entry and what the handler names it by.
    const bindings = { ...this.logFields(message), entry: message.id, ...this.partitionField(p) };
    p.inFlight.add(message.id);
    // Stream ids are unique per stream only: the slot is named by partition and id.
    const slot = `${p.source.queue}/${p.index}/${message.id}`;
    // Out of the partition's in-flight set before its slot frees, as the slot was before.
    const work = this.pino
      .runInContext(() => this.traced(p, message, deliveries, () => this.slots.finishing(slot)), { bindings })
      .finally(() => p.inFlight.delete(message.id));
    const outcome = slots.hold(slot, work);
    return { id: message.id, deliveries, outcome };
  }

  /**
   * The delivery, its ack included, as a span continuing the trace of what queued the entry (its `traceparent`
   * field, when tracing was on then): one trace from the POST through every step. A no-op when tracing is off.
   */
  private traced(
    p: PartitionState,
    message: StreamMessage,
    deliveries: number,
    workDone: () => void,
  ): Promise<DeliveryOutcome> {
    const options = () => {
      const named: Record<string, string> = {};
      for (const [k, v] of Object.entries(this.logFields(message))) if (v !== undefined) named[k] = v;
      const attributes = {
        'messaging.system': 'redis',
        'messaging.operation.type': 'process',
        'messaging.destination.name': p.stream,
        'messaging.consumer.group.name': p.consumerGroup,
        'messaging.message.id': message.id,
        deliveries,
        ...named,
      };
      return { kind: SpanKind.CONSUMER, attributes };
    };
    return inSpanFrom(stepEntryTraceparent(message.fields), `process ${p.stream}`, options, async (span) => {
      const outcome = await this.process(p, message, deliveries, workDone);
      setOutcome(span, outcome, FAILED_OUTCOMES.has(outcome));
      return outcome;
    });
  }

  private async process(
    p: PartitionState,
    message: StreamMessage,
    deliveries: number,
    workDone: () => void,
  ): Promise<DeliveryOutcome> {
    const startedAt = performance.now();
    const finish = (outcome: DeliveryOutcome): DeliveryOutcome => {
      this.metrics.jobs.inc({ outcome });
      this.metrics.jobDuration.observe({ outcome }, (performance.now() - startedAt) / 1000);
      return outcome;
    };
    const named = { ...this.logFields(message), entry: message.id, deliveries };
    let result: DeliveryOutcome;
    let next: DeliveryResult['next'];
    try {
      const done = await this.handler.process(message, {
        source: p.source,
        delivery: deliveries,
        deadline: performance.now() + this.options.jobBudgetMs,
        stopRetrying: this.stopRetrying.signal,
        signal: this.hardStop.signal,
        workDone,
      });
      if (typeof done === 'string') result = done;
      else ({ outcome: result, next } = done);
    } catch (err) {
      const { kind: reason, retryable } = failureOf(err);
      if (retryable) {
        // Left pending and no longer refreshed: redelivered after claimIdleMs.
        if (err instanceof HandBackError) {
          // Not a failed try: its delivery count set back, so waiting on a slow holder never dead-letters it.
          await p.group
            .abandon(message.id, 0)
            .catch((e: unknown) => this.logger.warn(named, `could not hand back the entry: ${(e as Error).message}`));
          this.logger.log({ ...named, reason }, `handed back, will be redelivered: ${(err as Error).message}`);
          return finish('transient');
        }
        this.logger.warn({ ...named, reason }, `job failed, will be redelivered: ${(err as Error).message}`);
        return finish('transient');
      }
      this.logger.error({ ...named, reason }, `job failed for good: ${(err as Error).message}`);
      try {
        await this.deadLetter(p, message, reason, (err as Error).message);
      } catch (dlqErr) {
        // Still pending: it comes back and ends here again, or past maxDeliveries.
        this.logger.error(named, `dead-lettering failed: ${(dlqErr as Error).message}`);
        return finish('transient');
      }
      return finish('dead_lettered');
    }
    try {
      if (!next) await p.group.ack(message.id);
      else {
        const { acked, added } = await p.group.ackThenAdd(message.id, next);
        // Done here, acked elsewhere (another delivery, a dead letter): the gate still scheduled what follows.
        if (!acked && result !== 'duplicate')
          this.logger.warn(
            { ...named, result, added },
            'job finished but its entry had been acked or dead-lettered by another delivery',
          );
      }
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
  private async deadLetter(p: PartitionState, message: StreamMessage, reason: string, detail: string): Promise<void> {
    const hook = this.handler.deadLettered?.bind(this.handler);
    await p.group.deadLetter(message, reason, detail, hook && ((tx) => hook(tx, message, reason, p.source)));
    this.metrics.deadLetters.inc({ reason });
    this.afterDeadLetter(p, message, reason);
  }

  /** The handler's afterDeadLetter: the entry is out of the stream whatever it does, so its error is only logged. */
  private afterDeadLetter(p: PartitionState, message: StreamMessage, reason: string): void {
    try {
      this.handler.afterDeadLetter?.(message, reason, p.source);
    } catch (err) {
      this.logger.error(
        { ...this.logFields(message), entry: message.id },
        `after its dead letter: ${(err as Error).message}`,
      );
    }
  }

  /**
   * Lets the handler prepare a batch before its deliveries run (JobHandler.prepare); a failure there is only logged.
   */
  private prepare(p: PartitionState, messages: readonly StreamMessage[]): void {
    if (messages.length === 0 || !this.handler.prepare) return;
    try {
      this.handler.prepare(messages, p.source);
    } catch (err) {
      this.logger.warn(`preparing a batch of ${messages.length} failed: ${(err as Error).message}`);
    }
  }

  /** The partition (and queue) a log line is about, when there are several. */
  private partitionField(p: PartitionState): { partition?: number; queue?: string } {
    if (this.partitions.length === 1) return {};
    return this.options.queues.length === 1 ? { partition: p.index } : { queue: p.source.queue, partition: p.index };
  }

  /** What the handler names a delivery by in the logs (the summary job: its job id). */
  private logFields(message: StreamMessage): Readonly<Record<string, string | undefined>> {
    return this.handler.logFields?.(message) ?? {};
  }
}
