import { isUuid, type SummaryJob } from '@app/jobs';
import type { ErrorClass } from '@app/llm';
import type { StreamMessage } from '../consumer/job-handler';
import { JobError } from './job.errors';

/** A malformed message never gets better. */
const MALFORMED: ErrorClass = { kind: 'malformed', retryable: false };

/** The job a message carries, or a JobError: MALFORMED. */
export function parseSummaryJob(message: StreamMessage): SummaryJob {
  const { job_id: jobId, tenant, payload } = message.fields;
  if (!jobId || !isUuid(jobId)) throw new JobError('job_id is missing or not a UUID', MALFORMED);
  if (!tenant) throw new JobError('tenant is missing', MALFORMED);
  let parsed: unknown;
  try {
    parsed = JSON.parse(payload ?? '');
  } catch {
    throw new JobError('payload is not JSON', MALFORMED);
  }
  const p = parsed as { text?: unknown; notify?: unknown } | null;
  if (typeof p?.text !== 'string' || p.text.length === 0 || typeof p.notify !== 'string' || p.notify.length === 0) {
    throw new JobError('payload needs text and notify', MALFORMED);
  }
  return { jobId, tenant, payload: { text: p.text, notify: p.notify } };
}
