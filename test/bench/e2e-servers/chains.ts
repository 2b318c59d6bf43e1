import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';

/*
 * The chains the end-to-end benches drive, each a route whose run ends in one
 * notification to the webhook receiver: what a request sends, written once
 * for every load generator. `to` is unique per request and comes back as the
 * notification's payload.to, which is how an arrival is matched to its POST.
 * And what every load generator does with one: the POST, and the counts of
 * its answers.
 */

export const CHAINS = {
  /** POST /v1/summaries → the summarize job (one model call) → email.summary_ready. */
  summaries: {
    path: '/v1/summaries',
    body: (to: string) => ({ text: 'Open-loop load measures the whole chain.', notify: to }),
  },
  /** POST /v1/triage → classify, draft (a model call each), notify → email.triage_ready. */
  triage: {
    path: '/v1/triage',
    body: (to: string) => ({
      ticket_id: to.slice(0, to.indexOf('@')).slice(-64),
      text: 'My order arrived broken and I would like a replacement.',
      notify: to,
    }),
  },
} as const;

export type ChainName = keyof typeof CHAINS;

export function chainNamed(name: string): ChainName {
  if (!(name in CHAINS)) throw new Error(`no chain "${name}" (${Object.keys(CHAINS).join(', ')})`);
  return name as ChainName;
}

/** The notify address of request `i` of a window tagged `tag`. */
export const notifyAddress = (tag: string, i: number): string => `${tag}-${i}@bench.example`;

/**
 * Now, in ms since the epoch on the high-resolution clock (performance.timeOrigin + performance.now()): the clock the
 * webhook receiver stamps arrivals with, so a send and its arrival in two processes can be subtracted.
 */
export const now = (): number => performance.timeOrigin + performance.now();

/** What every load generator reports of its requests. */
export interface SentRuns {
  readonly sent: number;
  /** When each POST actually left, by its notify address. */
  readonly sentAt: Record<string, number>;
  /** Answers by status (0: no answer, a network error). */
  readonly statuses: Record<string, number>;
  /** Requests that got no answer, by error (its cause's code, or its message). */
  readonly errors: Record<string, number>;
}

/**
 * POSTs one run of `chain` to `origin` for `to`, with a fresh Idempotency-Key, and counts its answer (or the error
 * that left it without one) in `counts`; true when it was accepted (202). Never rejects.
 */
export async function postRun(
  origin: string,
  key: string,
  chain: ChainName,
  to: string,
  counts: Pick<SentRuns, 'statuses' | 'errors'>,
): Promise<boolean> {
  try {
    const res = await fetch(origin + CHAINS[chain].path, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
      body: JSON.stringify(CHAINS[chain].body(to)),
    });
    await res.arrayBuffer();
    counts.statuses[res.status] = (counts.statuses[res.status] ?? 0) + 1;
    return res.status === 202;
  } catch (err) {
    const cause = (err as Error & { cause?: { code?: string; message?: string } }).cause;
    counts.statuses['0'] = (counts.statuses['0'] ?? 0) + 1;
    const why = cause?.code ?? cause?.message ?? (err as Error).message;
    counts.errors[why] = (counts.errors[why] ?? 0) + 1;
    return false;
  }
}
