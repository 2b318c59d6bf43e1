import type { SummaryJob, SummaryJobPayload } from './summary-job';
import { isUuid } from '@app/ids';

/** A stream entry that is not a summary job, and never will be: retrying it cannot help. */
export class MalformedSummaryJobError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A JOBS_STREAM entry as read: its id and its flat field list as a map (fieldsOf). */
export interface SummaryJobEntry {
  readonly id: string;
  readonly fields: Readonly<Record<string, string>>;
}

/**
 * The job a stream entry of JOBS_STREAM carries (its fields as written by
 * SummaryJobQueue.enqueue), or a MalformedSummaryJobError.
 */
export function parseSummaryJob(entry: SummaryJobEntry): SummaryJob {
  const { job_id: jobId, tenant, payload } = entry.fields;
  if (!jobId || !isUuid(jobId)) throw new MalformedSummaryJobError('job_id is missing or not a UUID');
  if (!tenant) throw new MalformedSummaryJobError('tenant is missing');
  let parsed: unknown;
  try {
    parsed = JSON.parse(payload ?? '');
  } catch {
    throw new MalformedSummaryJobError('payload is not JSON');
  }
  return { jobId, tenant, payload: parseSummaryJobPayload(parsed) };
}

/**
 * A summary job's payload (its entry's `payload`, JSON-parsed): text and
 * notify, both non-empty strings (anything else dropped), or a
 * MalformedSummaryJobError. The summaries workflow's input parser.
 */
export function parseSummaryJobPayload(parsed: unknown): SummaryJobPayload {
  const p = parsed as { text?: unknown; notify?: unknown } | null;
  if (typeof p?.text !== 'string' || p.text.length === 0 || typeof p.notify !== 'string' || p.notify.length === 0) {
    throw new MalformedSummaryJobError('payload needs text and notify');
  }
  return { text: p.text, notify: p.notify };
}
