import { execFile, execFileSync, fork, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { clockTicksPerSecond, REPO_ROOT } from './processes';

/*
 * The load generator of the out-of-process benches: wrk when it is on PATH
 * (a process per run, its CPU read from the shell that waited for it), else
 * autocannon in a child process of its own (forked once, driven over IPC
 * round after round); either way the load it makes costs neither the
 * server's CPU nor the bench's event loop, and its own CPU is measured like
 * the servers'.
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
  /** The generator's own CPU over the run, when it runs a process per run (wrk). */
  readonly generatorCpuMicros?: number;
}

type Message = { id: number; spec: LoadSpec } | { id: number; result?: LoadResult; error?: string };

export interface LoadGenerator {
  /** What makes the load: `autocannon` (in a Node process) or `wrk` (C, a process per run). */
  readonly tool: 'autocannon' | 'wrk';
  /** The long-lived generator's process, to meter; undefined when each run reports its own CPU. */
  readonly pid?: number;
  run(spec: LoadSpec): Promise<LoadResult>;
  stop(): Promise<void>;
}

/**
 * The load generator: wrk when `BENCH_LOAD=wrk`, or when it is unset and
 * `wrk` is on PATH (it takes a fraction of autocannon's CPU, which on two
 * cores is CPU the server under test does not get); else autocannon.
 */
export async function startLoadGenerator(): Promise<LoadGenerator> {
  const wanted = process.env.BENCH_LOAD ?? (wrkOnPath() ? 'wrk' : 'autocannon');
  if (wanted === 'wrk') return wrkGenerator();
  if (wanted !== 'autocannon') throw new Error(`BENCH_LOAD must be wrk or autocannon, not ${wanted}`);
  return startAutocannon();
}

/** Forks the autocannon generator (this file) and resolves once it is up. */
async function startAutocannon(): Promise<LoadGenerator> {
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
    tool: 'autocannon',
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

function wrkOnPath(): boolean {
  try {
    execFileSync('wrk', ['--version'], { stdio: 'ignore' });
    return true;
  } catch (err) {
    // wrk --version prints its version and exits 1; only a missing binary is "not on PATH".
    return (err as NodeJS.ErrnoException).code !== 'ENOENT';
  }
}

/** A Lua string literal of any text. */
const lua = (text: string): string =>
  `"${text.replace(/[\\"\n\r\0]/g, (c) => `\\${c.charCodeAt(0).toString().padStart(3, '0')}`)}"`;

/**
 * wrk's script for one run: every request built afresh (each `[<id>]` in the
 * headers and body a fresh id when asked: a prefix unique to the run and a
 * counter), every answer's status and Idempotent-Replayed header counted, and
 * the figures printed as one JSON line that `runWrk` reads.
 */
function wrkScript(spec: LoadSpec): string {
  const headers = Object.entries(spec.headers)
    .map(([name, value]) => `[${lua(name)}] = ${lua(value)}`)
    .join(', ');
  const prefix = randomBytes(9).toString('base64url');
  return `
local method, body, fresh, prefix = ${lua(spec.method ?? 'POST')}, ${spec.body === undefined ? 'nil' : lua(spec.body)}, ${spec.freshIds ? 'true' : 'false'}, ${lua(prefix)}
local headers = { ${headers} }
local n = 0
statuses, replayed, answers = {}, 0, 0
request = function()
  n = n + 1
  local id = fresh and (prefix .. n) or "[<id>]"
  local h = {}
  for k, v in pairs(headers) do h[k] = (v:gsub("%[<id>%]", id)) end
  return wrk.format(method, nil, h, body and (body:gsub("%[<id>%]", id)) or nil)
end
response = function(status, hdrs)
  answers = answers + 1
  statuses[status] = (statuses[status] or 0) + 1
  if hdrs["Idempotent-Replayed"] == "true" or hdrs["idempotent-replayed"] == "true" then replayed = replayed + 1 end
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
done = function(summary, latency)
  local st, rep, ans = {}, 0, 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do st[k] = (st[k] or 0) + v end
    rep, ans = rep + t:get("replayed"), ans + t:get("answers")
  end
  local parts = {}
  for k, v in pairs(st) do table.insert(parts, string.format('"%d":%d', k, v)) end
  local e = summary.errors
  io.write(string.format('WRK_RESULT {"requests":%d,"durationMicros":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d,' ..
    '"errors":%d,"timeouts":%d,"answers":%d,"replayed":%d,"statuses":{%s}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, e.connect + e.read + e.write, e.timeout, ans, rep, table.concat(parts, ",")))
end
`;
}

interface WrkOutput {
  requests: number;
  durationMicros: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  errors: number;
  timeouts: number;
  answers: number;
  replayed: number;
  statuses: Record<string, number>;
}

/** wrk, one thread, a process per run; its CPU read from the shell that waited for it. */
function wrkGenerator(): LoadGenerator {
  const dir = mkdtempSync(join(tmpdir(), 'llmwf-wrk-'));
  let runs = 0;
  return {
    tool: 'wrk',
    async run(spec) {
      const script = join(dir, `run-${++runs}.lua`);
      writeFileSync(script, wrkScript(spec));
      const args = [
        '-t1',
        `-c${spec.connections}`,
        `-d${spec.durationSeconds}s`,
        '--timeout',
        '10s',
        '-s',
        script,
        spec.url,
      ];
      // The shell's cutime and cstime (fields 16 and 17 of its stat) are wrk's, once it has waited for it.
      const stdout = await new Promise<string>((resolve, reject) =>
        execFile(
          'sh',
          ['-c', 'wrk "$@"; code=$?; echo "WRK_STAT $(cat /proc/$$/stat)"; exit $code', 'sh', ...args],
          { maxBuffer: 16 * 1024 * 1024 },
          (err, out, errOut) => (err ? reject(new Error(`wrk failed: ${err.message} ${errOut}`)) : resolve(out)),
        ),
      );
      const line = /^WRK_RESULT (.*)$/m.exec(stdout);
      const stat = /^WRK_STAT (.*)$/m.exec(stdout);
      if (!line || !stat) throw new Error(`wrk printed no result: ${stdout}`);
      const r = JSON.parse(line[1]) as WrkOutput;
      const fields = stat[1].slice(stat[1].lastIndexOf(')') + 2).split(' ');
      const childTicks = Number(fields[13]) + Number(fields[14]);
      return check(spec, {
        total: r.requests,
        seconds: r.durationMicros / 1e6,
        latencyMs: { p50: r.p50 / 1000, p90: r.p90 / 1000, p99: r.p99 / 1000, max: r.max / 1000 },
        errors: r.errors,
        timeouts: r.timeouts,
        statuses: r.statuses,
        answers: r.answers,
        replayedAnswers: r.replayed,
        generatorCpuMicros: Math.round((childTicks * 1e6) / clockTicksPerSecond()),
      });
    },
    stop() {
      rmSync(dir, { recursive: true, force: true });
      return Promise.resolve();
    },
  };
}

interface RawRun {
  total: number;
  seconds: number;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  errors: number;
  timeouts: number;
  statuses: Record<string, number>;
  answers: number;
  replayedAnswers: number;
  generatorCpuMicros?: number;
}

/** A run's figures, or why they do not count: any other status, error or timeout, or replays not as asked. */
function check(spec: LoadSpec, run: RawRun): LoadResult {
  const statuses = Object.entries(run.statuses);
  const wrong = statuses.filter(([code]) => Number(code) !== spec.status);
  if (wrong.length > 0 || run.errors > 0 || run.timeouts > 0) {
    throw new Error(
      `${spec.url}: expected every answer ${spec.status}; got ${statuses.map(([c, n]) => `${c} x${n}`).join(', ')}` +
        `, ${run.errors} errors, ${run.timeouts} timeouts`,
    );
  }
  const requests = run.statuses[String(spec.status)] ?? 0;
  if (requests === 0) throw new Error(`${spec.url}: no answers`);
  if (spec.replayed === true && run.replayedAnswers !== run.answers)
    throw new Error(`${spec.url}: ${run.answers - run.replayedAnswers} of ${run.answers} answers were not replays`);
  if (spec.replayed === false && run.replayedAnswers > 0)
    throw new Error(`${spec.url}: ${run.replayedAnswers} of ${run.answers} answers were replays (keys not fresh?)`);
  return {
    requests,
    seconds: run.seconds,
    perSecond: requests / run.seconds,
    p50Ms: run.latencyMs.p50,
    p90Ms: run.latencyMs.p90,
    p99Ms: run.latencyMs.p99,
    maxMs: run.latencyMs.max,
    replayedAnswers: run.replayedAnswers,
    ...(run.generatorCpuMicros === undefined ? {} : { generatorCpuMicros: run.generatorCpuMicros }),
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
  return check(spec, {
    total: result.requests.total,
    seconds: result.duration,
    latencyMs: result.latency,
    errors: result.errors,
    timeouts: result.timeouts,
    statuses: Object.fromEntries(Object.entries(result.statusCodeStats).map(([code, s]) => [code, s.count])),
    answers,
    replayedAnswers,
  });
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
