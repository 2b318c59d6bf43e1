import { QueueLayout } from '@app/workflows';
import { CONSUMER_GROUP } from './summary-job';
import { SINGLE_STREAM, STREAM_TAG_PREFIX } from './summary-streams';

/** The queue every workflow shares unless it names its own (docs/workflows.md), and its consumer group. */
export const WORKFLOWS_QUEUE = 'workflows';
export const WORKFLOWS_GROUP = 'workflows';

/** A queue the operators' tools look into: its layout (its name is the layout's prefix) and its consumer group. */
export interface OperatedQueue {
  readonly name: string;
  readonly layout: QueueLayout;
  readonly group: string;
}

/**
 * Every queue whose dead letters and figures the admin tools cover, in the
 * order their dead letters tie (same stream id): summaries first, then the
 * shared workflows queue. Built from the summaries layout, so every queue has
 * the same JOB_STREAM_PARTITIONS count. Summaries' dead-letter ids keep
 * their plain form (`<ms>-<seq>`, `<partition>:<ms>-<seq>`); any other queue's
 * are prefixed with its name (`workflows/<ms>-<seq>`).
 */
export class OperatedQueues {
  readonly all: readonly OperatedQueue[];

  /** `others`: the queues after summaries; a workflow that names a queue of its own adds it here. */
  constructor(
    summaries: QueueLayout = SINGLE_STREAM,
    others: readonly { readonly name: string; readonly group: string }[] = [
      { name: WORKFLOWS_QUEUE, group: WORKFLOWS_GROUP },
    ],
  ) {
    this.all = [
      { name: STREAM_TAG_PREFIX, layout: summaries, group: CONSUMER_GROUP },
      ...others.map((q) => ({ name: q.name, layout: new QueueLayout(q.name, summaries.count), group: q.group })),
    ];
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
