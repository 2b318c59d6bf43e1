import { chainNamed, notifyAddress, now, postRun, type SentRuns } from './chains';

/*
 * The end-to-end benches' open-loop load: POSTs a chain's route (chains.ts:
 * /v1/summaries, /v1/triage) `rate` times a second for `seconds`, on a fixed
 * schedule whatever the answers (a request is sent when its time comes,
 * however many are still unanswered), each with a fresh Idempotency-Key and a
 * unique `notify` (`<tag>-<i>@bench.example`) that the notification carries
 * back as payload.to. Run to completion in a process of its own; prints one
 * JSON line on stdout (LoadReport).
 *
 * Times are chains.ts's `now()`, the clock the webhook receiver stamps its
 * arrivals with. Latency is measured from a request's scheduled time, not
 * from when it actually left: a sender that fell behind does not hide its
 * delay (no coordinated omission); lagMaxMs says how far behind it fell.
 *
 * Args: api origin, bearer key, chain, rate, seconds, tag.
 */
export interface LoadReport extends SentRuns {
  /** Scheduled send time of request i, by its notify address (sentAt: later than scheduled when the sender lags). */
  readonly scheduled: Record<string, number>;
  /** The most a send left after its scheduled time. */
  readonly lagMaxMs: number;
  /** POST answer latency (202s), p50 and p99, from scheduled time. */
  readonly answerP50Ms: number;
  readonly answerP99Ms: number;
}

const [origin, key, chainArg, rateArg, secondsArg, tag] = process.argv.slice(2);
const chain = chainNamed(chainArg);
const rate = Number(rateArg);
const total = Math.round(rate * Number(secondsArg));
const interval = 1000 / rate;

const scheduled: Record<string, number> = {};
const sentAt: Record<string, number> = {};
const counts = { statuses: {} as Record<string, number>, errors: {} as Record<string, number> };
const answers: number[] = [];
let lagMaxMs = 0;
const inFlight: Promise<void>[] = [];

function send(i: number, at: number): void {
  const to = notifyAddress(tag, i);
  scheduled[to] = at;
  const t = now();
  sentAt[to] = t;
  lagMaxMs = Math.max(lagMaxMs, t - at);
  inFlight.push(
    postRun(origin, key, chain, to, counts).then((accepted) => {
      if (accepted) answers.push(now() - at);
    }),
  );
}

async function main(): Promise<void> {
  const start = now() + 20;
  process.stderr.write(`sending ${total} at ${rate}/s\n`);
  let i = 0;
  await new Promise<void>((done) => {
    const tick = () => {
      const t = now();
      while (i < total && start + i * interval <= t) {
        send(i, start + i * interval);
        i++;
      }
      if (i >= total) done();
      else setTimeout(tick, Math.max(0, start + i * interval - now()));
    };
    tick();
  });
  await Promise.all(inFlight);
  answers.sort((a, b) => a - b);
  const q = (p: number) => answers[Math.min(answers.length - 1, Math.floor(answers.length * p))] ?? NaN;
  const report: LoadReport = {
    sent: total,
    scheduled,
    sentAt,
    ...counts,
    lagMaxMs,
    answerP50Ms: q(0.5),
    answerP99Ms: q(0.99),
  };
  process.stdout.write(JSON.stringify(report) + '\n');
}

void main();
