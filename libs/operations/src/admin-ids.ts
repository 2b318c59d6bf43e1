/*
 * The ids an operator names, parsed once for the admin API and the admin CLI.
 * Only an id that can exist goes on to Redis or PostgreSQL: one that cannot
 * would come back as a store error (a 503 "retry" that no retry mends), when
 * it is the caller's mistake (a 400, a usage error).
 */
import { JOB_STREAM_PARTITIONS_MAX, STREAM_ID_PART_MAX } from '@app/summary-queue';

/** PostgreSQL's bigint; a bigserial starts at 1. */
const ROW_ID_MAX = 2n ** 63n - 1n;

/** The id as given, or what is wrong with it, worded to follow the parameter's name. */
export type ParsedId = { readonly ok: true; readonly id: string } | { readonly ok: false; readonly message: string };

/** A queue's name in a dead-letter id (`workflows/...`): what a hash tag and a URL path segment take as they are. */
const QUEUE_NAME = '[a-z][a-z0-9_-]{0,63}';

/**
 * A dead-letter id, `<ms>-<seq>`, or `<partition>:<ms>-<seq>` (what the
 * listing gives when JOB_STREAM_PARTITIONS is above 1; a partition number is
 * 0 to 1023, no leading zeros), each prefixed with `<queue>/` for a queue
 * other than summaries (`workflows/1764460800000-0`). Whether the queue and
 * the partition exist is for the DeadLetterQueue to say (a 404), not the
 * syntax (a 400). Redis would also take `<ms>` alone, but as
 * `XRANGE <ms> <ms>` it is the whole millisecond and as `XDEL <ms>` it is
 * `<ms>-0`: a re-drive of it would run the millisecond's first dead letter
 * and delete `<ms>-0`, another one or none. So it is refused, as it always was.
 * At most 20 digits a part: Redis refuses an id longer than 127 characters,
 * whatever its value.
 */
export function parseDeadLetterId(raw: string): ParsedId {
  const parts = new RegExp(`^(?:${QUEUE_NAME}/)?(?:(0|[1-9]\\d{0,3}):)?(\\d{1,20})-(\\d{1,20})$`).exec(raw);
  if (!parts || (parts[1] !== undefined && Number(parts[1]) >= JOB_STREAM_PARTITIONS_MAX)) {
    const partitions = `(partition 0 to ${JOB_STREAM_PARTITIONS_MAX - 1})`;
    return {
      ok: false,
      message: raw.includes('/')
        ? 'must be a dead-letter id <queue>/<ms>-<seq> such as workflows/1764460800000-0, or ' +
          `<queue>/<partition>:<ms>-<seq> ${partitions} such as workflows/2:1764460800000-0 ` +
          '(a queue name is lower-case letters, digits, _ and -, starting with a letter)'
        : 'must be a dead-letter id <ms>-<seq> such as 1764460800000-0, or <partition>:<ms>-<seq> ' +
          `${partitions} such as 2:1764460800000-0`,
    };
  }
  if (BigInt(parts[2]) > STREAM_ID_PART_MAX || BigInt(parts[3]) > STREAM_ID_PART_MAX) {
    return { ok: false, message: `must be a dead-letter id whose parts are at most ${STREAM_ID_PART_MAX}` };
  }
  return { ok: true, id: raw };
}

/**
 * A workflow's name as a filter (`summaries`, `triage`): what a workflow may
 * be named. One no workflow has simply matches nothing.
 */
export function parseWorkflowName(raw: string): ParsedId {
  if (!/^[A-Za-z][A-Za-z0-9_.-]{0,63}$/.test(raw)) {
    return {
      ok: false,
      message: 'must be a workflow name such as triage: a letter, then up to 63 letters, digits, _, . or -',
    };
  }
  return { ok: true, id: raw };
}

/** An outbox row id: a whole number from 1 to bigint's largest. */
export function parseOutboxRowId(raw: string): ParsedId {
  if (!/^\d{1,19}$/.test(raw)) return { ok: false, message: 'must be an outbox row id, a whole number such as 42' };
  const id = BigInt(raw);
  if (id < 1n || id > ROW_ID_MAX) return { ok: false, message: `must be an outbox row id from 1 to ${ROW_ID_MAX}` };
  return { ok: true, id: raw };
}
