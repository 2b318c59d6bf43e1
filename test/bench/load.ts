import { fork, type ChildProcess } from 'node:child_process';
import { REPO_ROOT } from './processes';

/*
 * The load generator of the out-of-process benches: autocannon, run in a
 * child process of its own (forked once, driven over IPC round after round),
 * so the load it makes costs neither the server's CPU nor the bench's event
 * loop, and its own CPU can be read from /proc like the servers'.
 *
 * Every request's status is checked: a run in which any answer has another
 * status than the expected one, or any request errs or times out, rejects
 * (its figures are not counted). The Idempotent-Replayed header of every
 * answer is counted too, and checked against `replayed`: a first-request run
 * whose keys were not fresh, or a replay run that ran its handler, fails.
 */

export interface LoadSpec {
  readonly url: string;
  readonly method?: 'POST' | 'GET';
  readonly headers: Readonly<Record<string, string>>;
  readonly body?: string;
  /**
   * When true, every `[<id>]` in the headers (and body) is a fresh id per
   * request (autocannon's idReplacement: hyperid, 24 URL-safe characters,
   * unique per load generator). The request is rebuilt for every request
   * either way, so runs with fresh and fixed keys cost the generator alike.
   */
  readonly freshIds?: boolean;
  readonly connections: number;
  readonly durationSeconds: number;
  /** The only status every answer may have. */
  readonly status: number;
  /** Every answer must (true) or must not (false) carry Idempotent-Replayed: true; undefined: not checked. */
  readonly replayed?: boolean;
}

export interface LoadResult {
  /** Answers received (every one with the expected status). */
  readonly requests: number;
  readonly seconds: number;
  readonly perSecond: number;
  readonly p50Ms: number;
  readonly p90Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /** Answers that carried Idempotent-Replayed: true. */
  readonly replayedAnswers: number;
}

type Message = { id: number; spec: LoadSpec } | { id: number; result?: LoadResult; error?: string };

export interface LoadGenerator {
  readonly pid: number;
  run(spec: LoadSpec): Promise<LoadResult>;
  stop(): Promise<void>;
}

/** Forks the load generator (this file) and resolves once it is up. */
export async function startLoadGenerator(): Promise<LoadGenerator> {
  const child: ChildProcess = fork(__filename, ['--child'], {
    cwd: REPO_ROOT,
    execArgv: __filename.endsWith('.ts') ? ['-r', require.resolve('ts-node/register')] : [],
    env: { ...process.env, TS_NODE_TRANSPILE_ONLY: 'true' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const pending = new Map<number, { resolve: (r: LoadResult) => void; reject: (e: Error) => void }>();
  let nextId = 1;
  let exited = false;
  const exit = new Promise<void>((done) =>
    child.once('exit', (code, signal) => {
      exited = true;
      for (const p of pending.values()) p.reject(new Error(`load generator exited (${code ?? signal})`));
      pending.clear();
      done();
    }),
  );
  child.on('message', (msg: Message) => {
    const p = pending.get(msg.id);
    if (!p || 'spec' in msg) return;
    pending.delete(msg.id);
    if (msg.error !== undefined) p.reject(new Error(msg.error));
    else p.resolve(msg.result!);
  });
  await new Promise<void>((resolve, reject) => {
    child.once('message', () => resolve());
    child.once('exit', (code) => reject(new Error(`load generator exited before it was up (${code})`)));
  });
  return {
    pid: child.pid!,
    run(spec) {
      if (exited) return Promise.reject(new Error('load generator has exited'));
      const id = nextId++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        child.send({ id, spec } satisfies Message);
      });
    },
    async stop() {
      if (exited) return;
      child.kill('SIGTERM');
      await exit;
    },
  };
}

interface AutocannonResult {
  requests: { total: number };
  duration: number;
  latency: { p50: number; p90: number; p99: number; max: number };
  errors: number;
  timeouts: number;
  statusCodeStats: Record<string, { count: number }>;
}
type Autocannon = (opts: Record<string, unknown>, cb: (err: Error | null, result: AutocannonResult) => void) => void;

/** In the child: one autocannon run. */
async function runLoad(spec: LoadSpec): Promise<LoadResult> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- autocannon has no types; this is what we use
  const autocannon = require('autocannon') as Autocannon;
  let replayedAnswers = 0;
  let answers = 0;
  const result = await new Promise<AutocannonResult>((resolve, reject) =>
    autocannon(
      {
        url: spec.url,
        connections: spec.connections,
        pipelining: 1,
        duration: spec.durationSeconds,
        idReplacement: true,
        requests: [
          {
            method: spec.method ?? 'POST',
            headers: spec.headers,
            body: spec.body,
            onResponse: (_status: number, _body: unknown, _ctx: unknown, headers: Record<string, string>) => {
              answers++;
              if (headers['idempotent-replayed'] === 'true' || headers['Idempotent-Replayed'] === 'true')
                replayedAnswers++;
            },
          },
        ],
      },
      (err, res) => (err ? reject(err) : resolve(res)),
    ),
  );
  const statuses = Object.entries(result.statusCodeStats);
  const wrong = statuses.filter(([code]) => Number(code) !== spec.status);
  if (wrong.length > 0 || result.errors > 0 || result.timeouts > 0) {
    throw new Error(
      `${spec.url}: expected every answer ${spec.status}; got ${statuses.map(([c, s]) => `${c} x${s.count}`).join(', ')}` +
        `, ${result.errors} errors, ${result.timeouts} timeouts`,
    );
  }
  const requests = result.statusCodeStats[String(spec.status)]?.count ?? 0;
  if (requests === 0) throw new Error(`${spec.url}: no answers`);
  if (spec.replayed === true && replayedAnswers !== answers)
    throw new Error(`${spec.url}: ${answers - replayedAnswers} of ${answers} answers were not replays`);
  if (spec.replayed === false && replayedAnswers > 0)
    throw new Error(`${spec.url}: ${replayedAnswers} of ${answers} answers were replays (keys not fresh?)`);
  return {
    requests,
    seconds: result.duration,
    perSecond: requests / result.duration,
    p50Ms: result.latency.p50,
    p90Ms: result.latency.p90,
    p99Ms: result.latency.p99,
    maxMs: result.latency.max,
    replayedAnswers,
  };
}

if (require.main === module && process.argv.includes('--child')) {
  process.on('message', (msg: Message) => {
    if (!('spec' in msg)) return;
    runLoad(msg.spec).then(
      (result) => process.send!({ id: msg.id, result } satisfies Message),
      (err: unknown) =>
        process.send!({ id: msg.id, error: err instanceof Error ? err.message : String(err) } satisfies Message),
    );
  });
  process.send!({ id: 0 } satisfies Message);
}
