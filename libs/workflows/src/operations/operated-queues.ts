import { QueueLayout } from '../queue-layout';

/** The queue every workflow shares unless it names its own (docs/workflows.md), and its consumer group. */
export const WORKFLOWS_QUEUE = 'workflows';
export const WORKFLOWS_GROUP = 'workflows';

/** A queue the operators' tools look into: its layout (its name is the layout's prefix) and its consumer group. */
export interface OperatedQueue {
  readonly name: string;
  readonly layout: QueueLayout;
  readonly group: string;
  /**
   * The one workflow of a queue of its own (summaries: `summaries`): its
   * entries do not name it. Absent on the shared queue, whose entries do, and
   * where an entry without one (a `deleted_from_stream` record) has none.
   */
  readonly workflow?: string;
}

/** A queue after the first, built with the first one's partition count. */
export interface OtherQueue {
  readonly name: string;
  readonly group: string;
  readonly workflow?: string;
}

/**
 * Every queue whose dead letters and figures the admin tools cover, in the
 * order their dead letters tie (same stream id): the first (summaries, built
 * by libs/summary-queue, which owns its names), then the shared workflows
 * queue and any queue a workflow names for itself. Every queue has the first
 * one's JOB_STREAM_PARTITIONS count. The first queue's dead-letter ids keep
 * their plain form (`<ms>-<seq>`, `<partition>:<ms>-<seq>`); any other
 * queue's are prefixed with its name (`workflows/<ms>-<seq>`).
 */
export class OperatedQueues {
  readonly all: readonly OperatedQueue[];

  constructor(
    first: OperatedQueue,
    others: readonly OtherQueue[] = [{ name: WORKFLOWS_QUEUE, group: WORKFLOWS_GROUP }],
  ) {
    this.all = [first, ...others.map((q) => ({ ...q, layout: new QueueLayout(q.name, first.layout.count) }))];
  }

  /** The queue named `name`, or undefined. */
  named(name: string): OperatedQueue | undefined {
    return this.all.find((q) => q.name === name);
  }

  /** The queue whose dead-letter ids carry no prefix. */
  get default(): OperatedQueue {
    return this.all[0];
  }
}
