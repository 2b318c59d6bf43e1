import { WORKFLOWS_QUEUE } from '../operations/operated-queues';
import { QueueLayout } from '../queue-layout';

/** The queue every workflow that does not name its own shares; its entries name their workflow. */
export const SHARED_QUEUE = WORKFLOWS_QUEUE;

/** A queue name is a Redis hash tag's prefix and a key segment: kept to what needs no escaping. */
const QUEUE_NAME = /^[a-z][a-z0-9_-]{0,63}$/;

/** A workflow the api may start: its name alone (on the shared queue), or with a queue of its own. */
export type WorkflowRegistration = string | { readonly name: string; readonly queue?: string };

/** Where a registered workflow's runs go. */
export interface ClientWorkflow {
  readonly name: string;
  readonly queue: string;
  /** On the shared queue: the entries and the run record name the workflow (on its own queue it is implied). */
  readonly shared: boolean;
  readonly layout: QueueLayout;
}

/** Bad registrations: stops the start with what is wrong, as a route registered twice would. */
export class WorkflowRegistrationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * The registered workflows, by name, and the queues they use (each queue's
 * layout built once, from JOB_STREAM_PARTITIONS, as the worker builds it).
 */
export class ClientQueues {
  readonly workflows: ReadonlyMap<string, ClientWorkflow>;
  /** Each queue once, with the one workflow of a queue of its own (the shared queue's entries name theirs). */
  readonly queues: readonly { readonly layout: QueueLayout; readonly soleWorkflow?: string }[];

  constructor(registrations: readonly WorkflowRegistration[], partitions: number) {
    const workflows = new Map<string, ClientWorkflow>();
    const layouts = new Map<string, QueueLayout>();
    const owners = new Map<string, string>();
    for (const registration of registrations) {
      const { name, queue = SHARED_QUEUE } = typeof registration === 'string' ? { name: registration } : registration;
      if (typeof name !== 'string' || name.length === 0) throw new WorkflowRegistrationError('a workflow needs a name');
      if (workflows.has(name)) throw new WorkflowRegistrationError(`workflow "${name}" is registered twice`);
      if (!QUEUE_NAME.test(queue))
        throw new WorkflowRegistrationError(`workflow "${name}": queue "${queue}" must match ${String(QUEUE_NAME)}`);
      const shared = queue === SHARED_QUEUE;
      const owner = owners.get(queue);
      // An entry on a queue of its own does not name its workflow: two workflows there could not be told apart.
      if (!shared && owner !== undefined)
        throw new WorkflowRegistrationError(
          `workflows "${owner}" and "${name}" both name queue "${queue}": a queue of its own holds one workflow`,
        );
      owners.set(queue, name);
      let layout = layouts.get(queue);
      if (!layout) layouts.set(queue, (layout = new QueueLayout(queue, partitions)));
      workflows.set(name, { name, queue, shared, layout });
    }
    this.workflows = workflows;
    this.queues = [...layouts].map(([queue, layout]) =>
      queue === SHARED_QUEUE ? { layout } : { layout, soleWorkflow: owners.get(queue) },
    );
  }
}
