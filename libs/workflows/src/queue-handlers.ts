import type { ChainableCommander } from 'ioredis';
import type { DeliveryResult, EntrySource, JobHandler, JobRunContext, StreamMessage } from './consumer/job-handler';

/**
 * The consumer's one JOB_HANDLER when it works several kinds of queue: each
 * entry goes to its queue's handler (a plain JobQueue's own, else the
 * workflows'), hooks included.
 */
export class QueueHandlers implements JobHandler {
  constructor(
    private readonly byQueue: ReadonlyMap<string, JobHandler>,
    private readonly fallback: JobHandler,
  ) {}

  process(message: StreamMessage, ctx: JobRunContext): Promise<string | DeliveryResult> {
    return this.of(ctx.source.queue).process(message, ctx);
  }

  deadLettered(tx: ChainableCommander, message: StreamMessage, reason: string, source: EntrySource): void {
    this.of(source.queue).deadLettered?.(tx, message, reason, source);
  }

  prepare(messages: readonly StreamMessage[], source: EntrySource): void {
    this.of(source.queue).prepare?.(messages, source);
  }

  logFields(message: StreamMessage): Readonly<Record<string, string | undefined>> {
    // Log fields come without a source; every queue's entries name their run by `job_id`.
    return this.fallback.logFields?.(message) ?? {};
  }

  private of(queue: string): JobHandler {
    return this.byQueue.get(queue) ?? this.fallback;
  }
}
