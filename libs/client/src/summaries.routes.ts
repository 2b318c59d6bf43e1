import type { ApiClient, CallOptions } from './api-client';
import type { ApiResult } from './api-result';

export interface CreateSummaryRequest {
  /** 1..100000 characters. */
  readonly text: string;
  /** Where the "summary ready" email goes. */
  readonly notify: string;
}

/** `202` of POST /v1/summaries. */
export interface SummaryJob {
  readonly job_id: string;
  readonly status: 'queued';
}

/** `200` of GET /v1/summaries/<job_id>. */
export interface SummaryStatus {
  readonly job_id: string;
  readonly status: 'queued' | 'done' | 'failed';
  readonly summary?: string;
  readonly error?: string;
}

/**
 * POST /v1/summaries. The key names the job: the same key always names the
 * same job (a retry, or a replay, answers with its id). Build it from what the
 * request is about, e.g. `idempotencyKey('summary', documentId, revision)`.
 */
export function createSummary(
  client: ApiClient,
  request: CreateSummaryRequest,
  key: string,
  options: CallOptions = {},
): Promise<ApiResult<SummaryJob>> {
  return client.post<SummaryJob>('/v1/summaries', { text: request.text, notify: request.notify }, { ...options, key });
}

/** GET /v1/summaries/<job_id>: `rejected` with 404 for a job of another tenant or none. */
export function getSummary(
  client: ApiClient,
  jobId: string,
  options: CallOptions = {},
): Promise<ApiResult<SummaryStatus>> {
  return client.get<SummaryStatus>(`/v1/summaries/${encodeURIComponent(jobId)}`, options);
}
