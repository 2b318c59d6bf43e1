/**
 * The outbox message a finished summary job leaves behind: the relay delivers
 * it to the notification provider, under its dedupe key as the idempotency
 * key. Written here and nowhere else; the persistence lib stores it as given.
 */
export const SUMMARY_READY_TOPIC = 'email.summary_ready';
export const summaryReadyDedupeKey = (jobId: string): string => `summary_ready:${jobId}`;

export type SummaryReadyPayload = {
  readonly job_id: string;
  /** Who is told that the summary is ready. */
  readonly to: string;
};

export interface SummaryReadyMessage {
  readonly topic: typeof SUMMARY_READY_TOPIC;
  readonly dedupeKey: string;
  readonly payload: SummaryReadyPayload;
}

/** The summary_ready message of a job (`notify`: its payload's `notify`): one per job, whichever delivery writes it. */
export function summaryReadyMessage(jobId: string, notify: string): SummaryReadyMessage {
  return {
    topic: SUMMARY_READY_TOPIC,
    dedupeKey: summaryReadyDedupeKey(jobId),
    payload: { job_id: jobId, to: notify },
  };
}
