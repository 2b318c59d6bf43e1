import { Inject, Injectable, type Type } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { QueueLayout } from './queue-layout';
import {
  DEFAULT_QUEUE,
  StepMetadataDecorator,
  type WorkflowMetadata,
  WorkflowMetadataDecorator,
} from './workflow.decorators';
import {
  type StepDefinition,
  type WorkflowDefinition,
  type WorkflowQueue,
  WorkflowRegistry,
} from './workflow.registry';
import { WORKFLOWS_WORKER_OPTIONS, type WorkflowsWorkerOptions } from './workflows.options';

/**
 * A workflow's and a step's name: ASCII, so that a step's model calls'
 * Idempotency-Key (`wf:<run_id>:<step>:<n>:<digest>`) stays within the 128 characters
 * the gateway takes, and so that log lines and metric labels need no escaping.
 */
const NAME = /^[A-Za-z_][A-Za-z0-9_-]{0,63}$/;

/**
 * Finds the `@Workflow()` providers of the whole application (as
 * @nestjs/bullmq's explorer finds `@Processor()` hosts) and their `@Step()`
 * methods, and builds the registry the worker runs them from. A mistake a
 * run would only meet later (a name registered twice, a workflow without
 * steps, two groups for one queue) stops the start, naming every problem.
 */
@Injectable()
export class WorkflowsExplorer {
  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    @Inject(WORKFLOWS_WORKER_OPTIONS) private readonly options: WorkflowsWorkerOptions,
  ) {}

  explore(): WorkflowRegistry {
    const problems: string[] = [];
    const found: WorkflowDefinition[] = [];
    const seen = new Set<object>();
    for (const wrapper of this.discovery.getProviders()) {
      const type = wrapper.metatype as Type<object> | null | undefined;
      if (typeof type !== 'function' || wrapper.inject) continue; // factories carry no class metadata of theirs
      const meta = this.reflector.get<WorkflowMetadata | undefined>(WorkflowMetadataDecorator, type);
      // One class provided by two modules is still one workflow: it is run from the first.
      if (!meta || seen.has(type)) continue;
      seen.add(type);
      if (!wrapper.isDependencyTreeStatic()) {
        problems.push(`workflow "${meta.name}" (${type.name}): a workflow must be a singleton provider`);
        continue;
      }
      const definition = this.definition(meta, type, () => wrapper.instance as object, problems);
      if (definition) found.push(definition);
    }
    const byName = new Map<string, WorkflowDefinition>();
    for (const w of found) {
      const other = byName.get(w.name);
      if (other) problems.push(`workflow "${w.name}" is registered twice: by ${other.type.name} and ${w.type.name}`);
      else byName.set(w.name, w);
    }
    const queues = new Map<string, { group: string; workflows: Map<string, WorkflowDefinition> }>();
    for (const w of byName.values()) {
      const queue = queues.get(w.queue);
      if (!queue) queues.set(w.queue, { group: w.group, workflows: new Map([[w.name, w]]) });
      // An entry on a queue of its own names no workflow: a second one there could not be told apart (as the client).
      else if (w.queue !== DEFAULT_QUEUE)
        problems.push(
          `workflows "${[...queue.workflows.keys()][0]}" and "${w.name}" both name queue "${w.queue}": ` +
            'a queue of its own holds one workflow',
        );
      else if (queue.group !== w.group)
        problems.push(
          `queue "${w.queue}" has two consumer groups: "${queue.group}" and "${w.group}" (workflow "${w.name}")`,
        );
      else queue.workflows.set(w.name, w);
    }
    if (problems.length > 0) throw new Error(`Workflows: ${problems.join('; ')}`);
    // Queues in the order `workflows` lists their workflows (found elsewhere: after them): the consumer's first
    // queue keeps the loop names of the days it was the only one.
    const listed = this.options.workflows ?? [];
    const rank = (q: { workflows: Map<string, WorkflowDefinition> }) =>
      Math.min(...[...q.workflows.values()].map((w) => (listed.includes(w.type) ? listed.indexOf(w.type) : Infinity)));
    return new WorkflowRegistry(
      [...queues]
        .sort(([, a], [, b]) => rank(a) - rank(b) || 0)
        .map(([name, q]): WorkflowQueue => ({
          name,
          group: q.group,
          layout: new QueueLayout(name, this.options.partitions ?? 1),
          shared: q.workflows.size > 1,
          workflows: q.workflows,
        })),
    );
  }

  private definition(
    meta: WorkflowMetadata,
    type: Type<object>,
    instance: () => object,
    problems: string[],
  ): WorkflowDefinition | undefined {
    const where = `workflow "${meta.name}" (${type.name})`;
    const before = problems.length;
    if (!NAME.test(meta.name)) problems.push(`${where}: a workflow's name must match ${NAME}`);
    const queue = meta.queue ?? DEFAULT_QUEUE;
    if (!NAME.test(queue)) problems.push(`${where}: a queue's name must match ${NAME}`);
    if (meta.deadlineS !== undefined && !(meta.deadlineS > 0))
      problems.push(`${where}: deadlineS must be a positive number`);
    const steps: StepDefinition[] = [];
    const prototype = type.prototype as Record<string, unknown>;
    for (const method of this.scanner.getAllMethodNames(prototype)) {
      const options = this.reflector.get<{ name?: string; timeoutS?: number } | undefined>(
        StepMetadataDecorator,
        prototype[method] as () => unknown,
      );
      if (!options) continue;
      const name = options.name ?? method;
      if (!NAME.test(name)) problems.push(`${where}: step "${name}": a step's name must match ${NAME}`);
      if (steps.some((s) => s.name === name)) problems.push(`${where}: step "${name}" is declared twice`);
      if (options.timeoutS !== undefined && !(options.timeoutS > 0))
        problems.push(`${where}: step "${name}": timeoutS must be a positive number`);
      steps.push({
        name,
        method,
        ...(options.timeoutS === undefined ? {} : { timeoutMs: options.timeoutS * 1000 }),
      });
    }
    if (steps.length === 0) problems.push(`${where} has no @Step() method`);
    if (problems.length > before) return undefined;
    return {
      name: meta.name,
      queue,
      group: meta.group ?? queue,
      ...(meta.input === undefined ? {} : { input: meta.input }),
      ...(meta.parse === undefined ? {} : { parse: meta.parse }),
      ...(meta.deadlineS === undefined ? {} : { deadlineMs: meta.deadlineS * 1000 }),
      steps,
      type,
      instance,
    };
  }
}
