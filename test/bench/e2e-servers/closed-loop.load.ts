import { chainNamed, notifyAddress, now, postRun, type SentRuns } from './chains';
import type { Arrival } from './webhook-receiver.server';

/*
 * The end-to-end benches' closed-loop load: `clients` clients, each POSTing a
 * chain's route (chains.ts) and waiting for that run's notification to reach
 * the webhook receiver before it sends the next, for `seconds`; then the runs
 * in flight finish. So the rate is what the chain sustains, and runs per
 * second is its throughput. A client learns of its notification from the
 * receiver's GET /arrivals/stream (subscribed before the first send), matched
 * by the unique `notify` each run carries; the receiver also keeps every
 * arrival, from which the bench counts duplicates and strays itself.
 *
 * Times are chains.ts's `now()`, the clock the receiver stamps arrivals
 * with. Run to completion in a process of its own; prints
 * `sending` on stderr when the clients start, and one JSON line on stdout
 * (ClosedLoopReport).
 *
 * Args: api origin, bearer key, chain, clients, seconds, tag, receiver origin.
 */
export interface ClosedLoopReport extends SentRuns {
  /** Runs whose notification the client saw. */
  readonly completed: number;
  /** Accepted runs whose notification did not come within the wait (30 s): counted missing by the bench too. */
  readonly timedOut: number;
  /** The first send and the last notification seen: the window runs per second are counted over. */
  readonly firstSendAt: number;
  readonly lastArrivalAt: number;
  /** POST to notification, p50 and p99, of the completed runs. */
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** The POST's own answer (202s), p50 and p99. */
  readonly answerP50Ms: number;
  readonly answerP99Ms: number;
}

const WAIT_MS = 30_000;

const [origin, key, chainArg, clientsArg, secondsArg, tag, receiver] = process.argv.slice(2);
const chain = chainNamed(chainArg);
const clients = Number(clientsArg);

const waiting = new Map<string, (at: number) => void>();
const sentAt: Record<string, number> = {};
const counts = { statuses: {} as Record<string, number>, errors: {} as Record<string, number> };
const latencies: number[] = [];
const answers: number[] = [];
let timedOut = 0;
let lastArrivalAt = 0;

/** Resolves each waiting client as its notification comes, for as long as `signal` lets the stream run. */
async function follow(signal: AbortSignal): Promise<void> {
  const res = await fetch(`${receiver}/arrivals/stream`, { signal });
  if (!res.ok || !res.body) throw new Error(`arrivals stream: ${res.status}`);
  void (async () => {
    const decoder = new TextDecoder();
    let rest = '';
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        const lines = (rest + decoder.decode(chunk, { stream: true })).split('\n');
        rest = lines.pop() ?? '';
        for (const line of lines) {
          const arrival = JSON.parse(line) as Arrival;
          waiting.get(arrival.to)?.(arrival.at);
        }
      }
    } catch (err) {
      if (!signal.aborted) throw err;
    }
  })();
}

async function oneRun(i: number): Promise<void> {
  const to = notifyAddress(tag, i);
  // Waiting before the POST leaves: the notification can come before the answer does.
  let timer: NodeJS.Timeout | undefined;
  const arrived = new Promise<number | undefined>((done) => {
    waiting.set(to, done);
    timer = setTimeout(() => done(undefined), WAIT_MS);
  });
  const t0 = now();
  sentAt[to] = t0;
  const accepted = await postRun(origin, key, chain, to, counts);
  if (accepted) answers.push(now() - t0);
  const at = accepted ? await arrived : undefined;
  clearTimeout(timer);
  waiting.delete(to);
  if (at === undefined) {
    if (accepted) timedOut++;
    return;
  }
  latencies.push(at - t0);
  lastArrivalAt = Math.max(lastArrivalAt, at);
}

async function main(): Promise<void> {
  const stream = new AbortController();
  await follow(stream.signal);
  process.stderr.write(`sending with ${clients} clients for ${secondsArg} s\n`);
  const firstSendAt = now();
  const end = firstSendAt + Number(secondsArg) * 1000;
  let next = 0;
  const client = async () => {
    while (now() < end) await oneRun(next++);
  };
  await Promise.all(Array.from({ length: clients }, client));
  stream.abort();
  const q = (values: number[], p: number) => {
    values.sort((a, b) => a - b);
    return values[Math.min(values.length - 1, Math.floor(values.length * p))] ?? NaN;
  };
  const report: ClosedLoopReport = {
    sent: next,
    sentAt,
    ...counts,
    completed: latencies.length,
    timedOut,
    firstSendAt,
    lastArrivalAt,
    p50Ms: q(latencies, 0.5),
    p99Ms: q(latencies, 0.99),
    answerP50Ms: q(answers, 0.5),
    answerP99Ms: q(answers, 0.99),
  };
  process.stdout.write(JSON.stringify(report) + '\n');
}

void main();
