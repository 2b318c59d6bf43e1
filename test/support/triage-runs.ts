import type { DynamicModule, Type } from '@nestjs/common';
import { jobIdFor } from '@app/summary-queue';
import { QueueLayout, stepEntryFields } from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { StreamsConsumerOptions } from '../../libs/workflows/src/consumer/streams-consumer.options';
import { startWorker, type WorkerHarness } from './worker-harness';

/*
 * What the suites that run triage on the real worker share: workers started
 * and closed together, a run started as the api starts one, the consumer
 * driven until it has nothing left to do.
 */

/** The shared workflows queue, one partition (JOB_STREAM_PARTITIONS' default), and its consumer group. */
export const WORKFLOWS = new QueueLayout('workflows', 1);
export const WORKFLOWS_GROUP = 'workflows';
export const TRIAGE_TEXT = 'My invoice for March was charged twice. Please refund the second charge of 49 EUR.';

export interface TriageRun {
  readonly runId: string;
  readonly input: Record<string, unknown>;
}

/** Workers on the fake model at `modelUrl()`, each closed by `closeAll` (afterEach). */
export function workerPool(modelUrl: () => string) {
  const started: WorkerHarness[] = [];
  return {
    async start(
      env: Record<string, string> = {},
      consumer: Partial<StreamsConsumerOptions> = {},
      imports: readonly (Type<unknown> | DynamicModule)[] = [],
    ): Promise<WorkerHarness> {
      const w = await startWorker({ modelUrl: modelUrl(), env, consumer, imports });
      started.push(w);
      return w;
    },
    async closeAll(): Promise<void> {
      await Promise.all(started.splice(0).map((w) => w.close()));
    },
  };
}

/** What POST /v1/triage does once its idempotency claim is made: the run's record and its first step's entry. */
export async function startTriageRun(
  redis: Redis,
  input: Record<string, unknown> = { ticket_id: 'T-1', text: TRIAGE_TEXT, notify: 'agent@example.com' },
  extra: Record<string, string> = {},
): Promise<TriageRun> {
  const [p] = WORKFLOWS.partitions;
  const runId = jobIdFor(`tenant-a:POST:/v1/triage:${randomUUID()}`);
  await redis.hset(p.jobRecordKey(runId), 'tenant', 'tenant-a', 'workflow', 'triage', 'accepted_at', Date.now());
  const fields = stepEntryFields({ runId, tenant: 'tenant-a', payload: JSON.stringify(input), workflow: 'triage' });
  for (const [k, v] of Object.entries(extra)) fields.push(k, v);
  await redis.xadd(p.jobs, '*', ...fields);
  return { runId, input };
}

/** Runs turns of the consumer until nothing is left to do; what each delivery came to, in order. */
export async function drain(w: WorkerHarness): Promise<string[]> {
  const outcomes: string[] = [];
  for (let turn = 0; turn < 20; turn++) {
    const ran = await w.consumer.runOnce();
    if (ran.length === 0) break;
    outcomes.push(...ran.map((r) => r.outcome));
  }
  return outcomes;
}
