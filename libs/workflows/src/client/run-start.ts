import { type Durability, NotReplicatedError, RedisScript, type RedisClient } from '@app/redis';
import { activeTraceparent } from '@app/tracing';
import type { QueuePartition } from '../queue-layout';
import { JOB_RECORD_TTL_MS } from '../run-ids';
import { RunNotQueuedError, RunTenantMismatchError } from './workflow-client.errors';

/** The error the start script replies with when the run's record names another tenant. */
const WRONG_TENANT = 'WRONGTENANT';

/*
 * A run's start, the summaries enqueue generalised: the run record and the
 * first step's entry in one script (one round trip, never one without the
 * other: both under the run's partition's tag). accepted_at keeps the first
 * time; a second start of the same run (a retry after a crash before the
 * idempotency record was finalised) adds a second entry with the same run id,
 * which the worker's step rows make run once. A record that names another
 * tenant is left as it is and nothing is queued: a run id is one tenant's
 * (it derives from the tenant's operation), and overwriting the tenant would
 * hand the run, and what GET shows of it, to the other. On the shared queue
 * the record and the entry name the workflow (ARGV[6]); on a queue of its own
 * they do not, so a summaries entry is exactly what the summaries route
 * always wrote (job_id, tenant, payload). With tracing on, the entry carries
 * the request's `traceparent` too (ARGV[7]; wire.ts), which the worker's
 * delivery continues.
 * KEYS: the run record, the stream. ARGV: run id, tenant, payload, accepted_at
 * (ms), record TTL (ms), workflow or '', traceparent or ''.
 */
const START = new RedisScript(
  'workflow-start',
  `local owner = redis.call('HGET', KEYS[1], 'tenant')
if owner and owner ~= ARGV[2] then
  return redis.error_reply('${WRONG_TENANT} run ' .. ARGV[1] .. ' belongs to another tenant')
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'tenant', ARGV[2], 'workflow', ARGV[6])
else
  redis.call('HSET', KEYS[1], 'tenant', ARGV[2])
end
redis.call('HSETNX', KEYS[1], 'accepted_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local fields = {'job_id', ARGV[1], 'tenant', ARGV[2], 'payload', ARGV[3]}
if ARGV[6] ~= '' then
  table.insert(fields, 'workflow')
  table.insert(fields, ARGV[6])
end
if ARGV[7] ~= '' then
  table.insert(fields, 'traceparent')
  table.insert(fields, ARGV[7])
end
return redis.call('XADD', KEYS[2], '*', unpack(fields))`,
);

/** A run's first step, as the start queues it. */
export interface RunStartEntry {
  readonly runId: string;
  readonly tenant: string;
  /** The run's input: the entry's `payload`, as JSON. */
  readonly input: unknown;
  /** Only on a shared queue, whose entries must name their workflow. */
  readonly workflow?: string;
}

/**
 * Redis's answers that mean "not now" rather than "never": the server is
 * loading, read-only or failing over, out of memory, or busy with a script.
 * Any other reply error (WRONGTYPE, NOPERM, an error in the script) is a bug
 * or a misconfiguration a retry does not fix.
 */
const TRANSIENT_REPLIES = /^(LOADING|READONLY|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|BUSY|OOM|NOREPLICAS|MOVED|ASK)\b/;

/**
 * Writes the run's record and its first step's entry in `partition` (the
 * run's partition of its workflow's queue), durably as RedisModule's
 * durability asks; returns the entry id. The one writer of a run's start:
 * WorkflowClient.start, and SummaryJobQueue.enqueue for a summaries job of a
 * known id (tests, benches). RunNotQueuedError when Redis did not take it or
 * no replica confirmed it; RunTenantMismatchError when the record is another
 * tenant's; anything else is thrown as it came.
 */
export async function writeRunStart(
  redis: RedisClient,
  partition: QueuePartition,
  entry: RunStartEntry,
  durability: Durability | undefined,
): Promise<string> {
  const args = [
    entry.runId,
    entry.tenant,
    JSON.stringify(entry.input),
    Date.now(),
    JOB_RECORD_TTL_MS,
    entry.workflow ?? '',
    activeTraceparent() ?? '',
  ];
  try {
    return await START.runDurably<string>(
      redis,
      [partition.jobRecordKey(entry.runId), partition.jobs],
      args,
      durability,
    );
  } catch (err) {
    throw startError(err, entry.tenant);
  }
}

/** What a failed start script means to its caller (pure: unit-tested). */
export function startError(err: unknown, tenant: string): unknown {
  if (err instanceof NotReplicatedError) return new RunNotQueuedError('not_replicated', err);
  if (!(err instanceof Error)) return err;
  if (err.message.startsWith(`${WRONG_TENANT} `)) return new RunTenantMismatchError(tenant, 'record');
  // ioredis's own errors (connection closed, command timed out, offline) are not replies: Redis did not answer.
  if (err.name !== 'ReplyError' || TRANSIENT_REPLIES.test(err.message))
    return new RunNotQueuedError('unreachable', err);
  return err;
}
