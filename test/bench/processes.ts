import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { once } from 'node:events';
import { createConnection, createServer } from 'node:net';
import { isAbsolute, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import { memoryCgroup, type MemoryCgroup } from './memory-limit';

/*
 * The out-of-process side of the benches: servers (and load generators) run
 * as Node child processes of their own, so they get their own event loop and
 * their own CPU accounting, and what each one costs is read from /proc.
 *
 * Linux only (/proc, getconf).
 */

/** The root of this repository: .ts scripts under it run through ts-node and tsconfig-paths. */
export const REPO_ROOT = resolve(__dirname, '../..');

export interface SpawnServerOptions {
  /** Named in errors. */
  readonly name: string;
  /**
   * The script to run with process.execPath; relative to cwd. A .ts script
   * inside this repo gets `-r ts-node/register -r tsconfig-paths/register`
   * (and TS_NODE_TRANSPILE_ONLY=true unless env says otherwise).
   */
  readonly script: string;
  readonly args?: readonly string[];
  /** Added to (and overriding) process.env. */
  readonly env?: Readonly<Record<string, string>>;
  /** Defaults to the repository root. */
  readonly cwd?: string;
  /** Node options placed before the script (e.g. --max-old-space-size=512). */
  readonly nodeArgs?: readonly string[];
  /**
   * When the server is ready, one of:
   * - a RegExp or predicate matched against each line it prints on stdout or
   *   stderr. A RegExp's first group, when it has one, is the server's URL
   *   (`http://...`) or its port (digits; the URL is then http://127.0.0.1:<port>).
   *   stdout is then piped and drained by this process for the child's whole
   *   life (lines discarded after the ready one): that costs this process a
   *   little CPU per line, so a server that logs every request should rather
   *   print its ready line on stderr and be given `stdout: 'ignore'` or a file;
   *   the ready line is looked for on stderr then.
   * - `{ url }`: that URL is polled (GET, any status counts) every 50 ms until
   *   it answers; the server's URL is its origin.
   */
  readonly ready: RegExp | ((line: string) => boolean) | { readonly url: string };
  /**
   * Where stdout goes: 'ignore' (/dev/null), 'pipe' (drained here), or
   * `{ file }` (appended to). Default: 'pipe' for a line matcher, 'ignore'
   * for a URL.
   */
  readonly stdout?: 'ignore' | 'pipe' | { readonly file: string };
  /** How long to wait for ready before killing the child and rejecting; default 60 s. */
  readonly timeoutMs?: number;
  /**
   * Runs the child in a memory cgroup of this limit, as a pod's (memory-limit.ts); without one where none can be
   * made.
   */
  readonly memoryLimitMiB?: number;
}

export interface SpawnedServer {
  readonly name: string;
  readonly pid: number;
  /** The server's origin (`http://127.0.0.1:3000`), when the ready line or URL gave one. */
  readonly url: string | undefined;
  readonly port: number | undefined;
  /** The child, for anything else (its exit, its stdio). */
  readonly child: ChildProcess;
  /** Its memory cgroup, when memoryLimitMiB was asked for and one could be made. */
  readonly memory: MemoryCgroup | undefined;
  /** The last 64 KiB the child wrote on stderr. */
  stderr(): string;
  /** How it ended, once it has; undefined while it runs. */
  exited(): { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** Throws (with its stderr) when it is no longer running: for a bench to check its server between rounds. */
  assertRunning(): void;
  /** SIGTERM, then SIGKILL after `graceMs` (default 10 s); resolves once it has exited. */
  stop(graceMs?: number): Promise<void>;
}

const STDERR_KEPT = 64 * 1024;
const running = new Set<ChildProcess>();
let exitHookInstalled = false;

/** A child left behind by a crashed bench would keep its port and load the machine: all die when this process exits. */
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const child of running) child.kill('SIGKILL');
  });
}

/**
 * Starts `opts.script` as a Node child process and resolves once it is ready;
 * a child that exits (or times out) before that rejects with its stderr.
 */
export async function spawnServer(opts: SpawnServerOptions): Promise<SpawnedServer> {
  installExitHook();
  const cwd = opts.cwd ?? REPO_ROOT;
  const scriptPath = resolve(cwd, opts.script);
  const inRepo = !relative(REPO_ROOT, scriptPath).startsWith('..') && !isAbsolute(relative(REPO_ROOT, scriptPath));
  const isTs = /\.[cm]?ts$/.test(scriptPath) && inRepo;
  const nodeArgs = [
    ...(isTs ? ['-r', require.resolve('ts-node/register'), '-r', require.resolve('tsconfig-paths/register')] : []),
    ...(opts.nodeArgs ?? []),
  ];
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    ...(isTs ? { TS_NODE_TRANSPILE_ONLY: 'true', TS_NODE_PROJECT: resolve(REPO_ROOT, 'tsconfig.json') } : {}),
    ...opts.env,
  };
  const matcher = opts.ready instanceof RegExp || typeof opts.ready === 'function' ? opts.ready : undefined;
  const probeUrl = opts.ready instanceof RegExp || typeof opts.ready === 'function' ? undefined : opts.ready.url;
  const stdoutMode = opts.stdout ?? (matcher ? 'pipe' : 'ignore');
  let stdoutFd: number | undefined;
  let stdio: 'ignore' | 'pipe' | number;
  if (stdoutMode === 'ignore' || stdoutMode === 'pipe') stdio = stdoutMode;
  else stdio = stdoutFd = openSync(stdoutMode.file, 'a');

  const memory = opts.memoryLimitMiB === undefined ? undefined : memoryCgroup(opts.name, opts.memoryLimitMiB);
  const command = [process.execPath, ...nodeArgs, scriptPath, ...(opts.args ?? [])];
  // In its cgroup before Node starts (so V8 sizes its heap from the limit): the shell joins it, then execs Node.
  const [file, ...args] = memory
    ? ['/bin/sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', memory.path, ...command]
    : command;
  const child = spawn(file, args, { cwd, env, stdio: ['ignore', stdio, 'pipe'] });
  if (stdoutFd !== undefined) closeSync(stdoutFd);
  running.add(child);
  let stderrText = '';
  let exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const exitPromise = new Promise<void>((done) => {
    child.once('exit', (code, signal) => {
      exited = { code, signal };
      running.delete(child);
      memory?.remove();
      done();
    });
  });

  let url: string | undefined;
  let port: number | undefined;
  const fromMatch = (found: string | undefined) => {
    if (found === undefined) return;
    if (/^\d+$/.test(found)) {
      port = Number(found);
      url = `http://127.0.0.1:${port}`;
    } else {
      url = new URL(found).origin;
      port = Number(new URL(found).port) || undefined;
    }
  };

  let markReady: () => void = () => {};
  const readyPromise = new Promise<void>((done) => (markReady = done));
  const onLine = (line: string) => {
    if (!matcher) return;
    if (matcher instanceof RegExp) {
      const m = matcher.exec(line);
      if (!m) return;
      fromMatch(m[1]);
    } else if (!matcher(line)) return;
    markReady();
  };
  child.stderr!.setEncoding('utf8');
  createInterface({ input: child.stderr! }).on('line', (line) => {
    stderrText = (stderrText + line + '\n').slice(-STDERR_KEPT);
    onLine(line);
  });
  if (child.stdout) createInterface({ input: child.stdout }).on('line', onLine);

  let polling = true;
  if (probeUrl !== undefined) {
    const probe = probeUrl;
    fromMatch(probe);
    void (async () => {
      while (polling && !exited) {
        try {
          const res = await fetch(probe, { signal: AbortSignal.timeout(1000) });
          await res.arrayBuffer();
          markReady();
          return;
        } catch {
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    })();
  }

  const stop = async (graceMs = 10_000): Promise<void> => {
    if (exited) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exitPromise;
    clearTimeout(timer);
  };

  const timeoutMs = opts.timeoutMs ?? 60_000;
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      readyPromise,
      exitPromise.then(() => {
        throw new Error(
          `${opts.name} exited before it was ready (code ${exited?.code}, signal ${exited?.signal}):\n${stderrText}`,
        );
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`${opts.name} was not ready within ${timeoutMs} ms:\n${stderrText}`)),
          timeoutMs,
        );
      }),
    ]);
  } catch (err) {
    polling = false;
    await stop(2000);
    throw err;
  } finally {
    polling = false;
    clearTimeout(timer);
  }
  return {
    name: opts.name,
    pid: child.pid!,
    url,
    port,
    child,
    memory,
    stderr: () => stderrText,
    exited: () => exited,
    assertRunning() {
      if (exited) throw new Error(`${opts.name} exited (code ${exited.code}, signal ${exited.signal}):\n${stderrText}`);
    },
    stop,
  };
}

/** A port free right now on 127.0.0.1 (the OS's pick), for a server that must be told its port. */
export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => done(port));
    });
  });
}

let clockTicks: number | undefined;
/** CLK_TCK: the unit of utime and stime in /proc/<pid>/stat (normally 100 per second). */
export function clockTicksPerSecond(): number {
  clockTicks ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  return clockTicks;
}

export interface ProcessSample {
  /** utime + stime of every thread of the process so far (not its children), in µs; resolution 1/CLK_TCK s (10 ms). */
  readonly cpuMicros: number;
  /** VmRSS now. */
  readonly rssBytes: number;
  /** VmHWM: the highest RSS of the process's whole life. */
  readonly peakRssBytes: number;
}

/** What /proc says of `pid` now. */
export function sampleProcess(pid: number): ProcessSample {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  const ticks = Number(fields[11]) + Number(fields[12]);
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string): number => {
    const m = new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status);
    return m ? Number(m[1]) * 1024 : 0;
  };
  return {
    cpuMicros: Math.round((ticks * 1e6) / clockTicksPerSecond()),
    rssBytes: kb('VmRSS'),
    peakRssBytes: kb('VmHWM'),
  };
}

export interface MeterReading {
  /** CPU the process used within the window, in µs (10 ms resolution: measure windows of seconds). */
  readonly cpuMicros: number;
  /** Wall time of the window, in µs. */
  readonly wallMicros: number;
  /** The highest VmRSS seen within the window (sampled every `everyMs`, and at its start and end). */
  readonly peakRssBytes: number;
  /** VmRSS at the end of the window. */
  readonly rssBytes: number;
  /** VmHWM at the end of the window: the process's lifetime peak. */
  readonly lifetimePeakRssBytes: number;
}

export interface Meter {
  stop(): MeterReading;
}

/** Starts measuring a window of `pid`'s life: `const m = meter(pid); ...; m.stop()`. */
export function meter(pid: number, everyMs = 100): Meter {
  const start = sampleProcess(pid);
  const t0 = process.hrtime.bigint();
  let peak = start.rssBytes;
  const timer = setInterval(() => {
    try {
      peak = Math.max(peak, sampleProcess(pid).rssBytes);
    } catch {
      // The process is gone; stop() says so.
    }
  }, everyMs);
  timer.unref();
  return {
    stop() {
      clearInterval(timer);
      const end = sampleProcess(pid);
      return {
        cpuMicros: end.cpuMicros - start.cpuMicros,
        wallMicros: Number(process.hrtime.bigint() - t0) / 1000,
        peakRssBytes: Math.max(peak, end.rssBytes),
        rssBytes: end.rssBytes,
        lifetimePeakRssBytes: end.peakRssBytes,
      };
    },
  };
}

/*
 * Redis's own count of the commands it has processed (INFO stats,
 * total_commands_processed). It counts every client of that Redis server,
 * whatever their database: the deltas are the bench's load only when
 * nothing else uses that Redis meanwhile (another engineer's test run on the
 * same server shows up here). Each reading is one INFO command of our own,
 * which Redis counts once it has answered (so the next reading includes it):
 * the readings here subtract every INFO this module sent before them, so a
 * delta between two readings holds only the other clients' commands. The
 * connection is made once per URL (its SELECT, before the first reading, is
 * in the baseline); closeRedisCounters() closes them.
 */
const counters = new Map<string, { redis: Redis; infos: number }>();

/** Commands Redis has processed in all, less the INFO commands this function sent before this one. */
export async function redisCommandCount(redisUrl: string): Promise<number> {
  let counter = counters.get(redisUrl);
  if (!counter) {
    counter = { redis: new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 }), infos: 0 };
    await counter.redis.connect();
    counters.set(redisUrl, counter);
  }
  const info = await counter.redis.info('stats');
  const own = counter.infos++;
  const m = /^total_commands_processed:(\d+)/m.exec(info);
  if (!m) throw new Error('INFO stats has no total_commands_processed');
  return Number(m[1]) - own;
}

/** Closes the connections redisCommandCount opened. */
export async function closeRedisCounters(): Promise<void> {
  for (const { redis } of counters.values()) await redis.quit().catch(() => redis.disconnect());
  counters.clear();
}

export interface MonitoredCommands {
  /** Commands clients sent in the database watched: each one a round trip, or one command of a pipeline or MULTI. */
  readonly commands: number;
  /** The same by command name (lower case), e.g. { evalsha: 1000 }. */
  readonly byCommand: Readonly<Record<string, number>>;
  /** Commands that scripts ran inside Redis (MONITOR's `lua` source): not round trips, not in `commands`. */
  readonly inScripts: number;
}

export interface RedisMonitor {
  stop(): Promise<MonitoredCommands>;
}

/**
 * Counts the commands sent to one database of a Redis server, through
 * MONITOR: unlike total_commands_processed (redisCommandCount), it sees
 * which database each command ran in, so other clients of the same server in
 * other databases (other test runs) are not counted. The price: MONITOR slows
 * Redis down and costs this process a little per command, so count in a pass
 * of its own, never in a timed one. `db` defaults to the URL's.
 */
export async function monitorRedis(redisUrl: string, db?: number): Promise<RedisMonitor> {
  const url = new URL(redisUrl);
  const watched = String(db ?? (Number(url.pathname.slice(1)) || 0));
  // A socket of its own, not ioredis's monitor(): on a busy server the first
  // lines can come in the packet of MONITOR's +OK, which ioredis takes for
  // replies to commands it never sent ("Command queue state error").
  const socket = createConnection({ host: url.hostname, port: Number(url.port) || 6379 });
  await once(socket, 'connect');
  if (url.password)
    socket.write(respCommand(url.username ? ['AUTH', url.username, url.password] : ['AUTH', url.password]));
  socket.write(respCommand(['MONITOR']));
  let commands = 0;
  let inScripts = 0;
  const byCommand: Record<string, number> = {};
  let rest = '';
  let failure: Error | undefined;
  socket.setEncoding('utf8');
  socket.on('data', (chunk: string) => {
    const lines = (rest + chunk).split('\r\n');
    rest = lines.pop() ?? '';
    for (const line of lines) {
      if (line.startsWith('-')) failure ??= new Error(`MONITOR: ${line.slice(1)}`);
      // +1764547200.123456 [13 127.0.0.1:50000] "xadd" "key" ...; a script's commands: [13 lua]
      const m = /^\+\d+\.\d+ \[(\d+) (\S+)\] "([^"]*)"/.exec(line);
      if (!m || m[1] !== watched) continue;
      if (m[2] === 'lua') {
        inScripts++;
        continue;
      }
      commands++;
      const name = m[3].toLowerCase();
      byCommand[name] = (byCommand[name] ?? 0) + 1;
    }
  });
  socket.on('error', (err) => (failure ??= err));
  return {
    async stop() {
      socket.destroy();
      if (failure) throw failure;
      return { commands, byCommand: { ...byCommand }, inScripts };
    },
  };
}

function respCommand(args: readonly string[]): string {
  return `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;
}
