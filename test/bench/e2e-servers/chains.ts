/*
 * The chains the end-to-end benches drive, each a route whose run ends in one
 * notification to the webhook receiver: what a request sends, written once
 * for every load generator. `to` is unique per request and comes back as the
 * notification's payload.to, which is how an arrival is matched to its POST.
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
