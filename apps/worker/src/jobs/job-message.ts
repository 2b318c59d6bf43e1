import { isUuid, type SummaryJob } from '@app/jobs';
import { PermanentJobError } from './job.errors';

/** A stream entry as read: its id and its flat field list turned into a map. */
export interface StreamMessage {
  readonly id: string;
  readonly fields: Readonly<Record<string, string>>;
}

/** The job a message carries, or a PermanentJobError: a malformed message never gets better. */
export function parseSummaryJob(message: StreamMessage): SummaryJob {
  const { job_id: jobId, tenant, payload } = message.fields;
  if (!jobId || !isUuid(jobId)) throw new PermanentJobError('job_id is missing or not a UUID', 'malformed');
  if (!tenant) throw new PermanentJobError('tenant is missing', 'malformed');
  let parsed: unknown;
  try {
    parsed = JSON.parse(payload ?? '');
  } catch {
    throw new PermanentJobError('payload is not JSON', 'malformed');
  }
  const p = parsed as { text?: unknown; notify?: unknown } | null;
  if (typeof p?.text !== 'string' || p.text.length === 0 || typeof p.notify !== 'string' || p.notify.length === 0) {
    throw new PermanentJobError('payload needs text and notify', 'malformed');
  }
  return { jobId, tenant, payload: { text: p.text, notify: p.notify } };
}
