import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { type LoadGenerator, type LoadResult, startLoadGenerator } from './load';
import {
  closeRedisCounters,
  freePort,
  meter,
  type MeterReading,
  monitorRedis,
  redisCommandCount,
  REPO_ROOT,
  sampleProcess,
  type SpawnedServer,
  spawnServer,
} from './processes';
import { addColumn, printComponents, profileWindow, WINDOW_PROFILE_PRELOAD } from './profile/window';
import { buildServers } from './servers/build';
import { KEY, median, ms, orderOf } from './support';

/*
 * POST /v1/summaries side by side, every side a server process of its own
 * driven by one load generator (wrk when it is on PATH, else autocannon:
 * load.ts), in alternating rounds (the order rotated each round) on one
 * machine, every request with a fresh Idempotency-Key unless it is a replay:
 *
 * - bare Nest: the endpoint a team writes without us, on Nest 12
 *   (peer/nest-anchor/server.js): a guard looking the Bearer key up in
 *   API_KEYS, hand-written checks of the body, one XADD, the 202; no
 *   logging, no metrics. The anchor of the goals;
 * - peer: that same app with @node-idempotency/nestjs 1.0.4 and its Redis
 *   adapter as its README configures it (PEER_IDEMPOTENCY=1), first request
 *   and replay;
 * - plain: our route without idempotency, on the api's own stack
 *   (servers/plain.ts: guard, DTO, validation pipe, logging, metrics, the
 *   same enqueue script): with ours, it splits the cost between our stack
 *   and idempotency;
 * - ours: the real api (apps/api/src/main.ts, through servers/ours.ts),
 *   first request and replay, as it ships (LOG_LEVEL=info: a line per
 *   answer), and the first request at LOG_LEVEL=silent (what logging costs).
 *
 * The Nest 12 servers of the repository run as JavaScript transpiled ahead
 * (servers/build.ts), not through ts-node, whose compiler would add ~200 MiB
 * to their RSS. Every server runs NODE_ENV=production, its stdout to
 * /dev/null. Redis is emptied before every round (not measured), so every
 * round starts from the same state, and the replay key is made again then.
 * CPU is the server process's utime + stime over the round (/proc, 10 ms
 * ticks), RSS its peak within the side's rounds. Redis round trips are
 * counted through MONITOR in a pass of their own after the timed rounds (the
 * bench's database only, what idle servers send taken out); Redis's INFO
 * count over the timed rounds is shown too, and is right only when nothing
 * else uses that Redis server.
 */

export interface SideBySideOptions {
  readonly rounds?: number;
  readonly secondsPerRound?: number;
  readonly warmupSeconds?: number;
  readonly connections?: number;
}

export interface SideRow {
  readonly side: string;
  readonly rounds: number;
  readonly connections: number;
  /** Medians over the rounds, and the spread of req/s over them. */
  readonly perSecond: number;
  readonly perSecondMin: number;
  readonly perSecondMax: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** The server process's CPU (all its threads) per answered request, µs: median over the rounds, and its spread. */
  readonly cpuMicrosPerRequest: number;
  readonly cpuMicrosPerRequestMin: number;
  readonly cpuMicrosPerRequestMax: number;
  /** The server's CPU over wall time in its rounds (100 = one core), median. */
  readonly serverCpuPercent: number;
  /** The load generator's, median: near 100 means it, not the server, may set the pace. */
  readonly loadGeneratorCpuPercent: number;
  /**
   * Redis commands per request, counted through MONITOR in a pass of its own
   * (not timed): commands sent in the bench's database only, those that
   * scripts run inside Redis not counted, the idle servers' own taken out.
   * Each is a round trip of its request's latency; on an auto-pipelined
   * connection concurrent requests' commands may share one network write.
   */
  readonly redisCommandsPerRequest: number;
  /** The same by command, per request: `evalsha 2, set 1`. */
  readonly redisCommands: string;
  /** Commands run inside scripts per request (not round trips). */
  readonly redisCommandsInScriptsPerRequest: number;
  /**
   * Redis's own count (INFO total_commands_processed) over the timed rounds,
   * per request: every client of that Redis server, so only right when
   * nothing else uses it.
   */
  readonly redisAllClientsCommandsPerRequest: number;
  /** The highest VmRSS of the server process seen within the side's rounds, MiB. */
  readonly peakRssMiB: number;
  /** Its VmRSS once started, before any load, MiB (ts-node's compiler included when the .ts servers run through it). */
  readonly idleRssMiB: number;
}

export interface SideRatio {
  readonly ratio: string;
  /** Median over the rounds of the two sides' req/s in the same round. */
  readonly median: number;
  readonly min: number;
  readonly max: number;
  /**
   * The same from CPU per request (the second side's µs/req over the first's,
   * same round): the ratio of req/s the two would reach if each had a core to
   * itself. Steadier than req/s on a machine others load too.
   */
  readonly byCpu: number;
  readonly byCpuMin: number;
  readonly byCpuMax: number;
  /** The goal for it. */
  readonly goal: string;
}

export interface SideBySideResult {
  readonly node: string;
  /** What made the load. */
  readonly loadGenerator: string;
  readonly rounds: number;
  readonly secondsPerRound: number;
  readonly connections: number;
  readonly rows: readonly SideRow[];
  readonly ratios: readonly SideRatio[];
  /** Redis commands per second the idle servers sent by themselves in the bench's database (subtracted above). */
  readonly idleRedisCommandsPerSecond: number;
  /** Commands/s the whole Redis server processed while the servers were idle: other clients, in the INFO column. */
  readonly idleRedisAllClientsCommandsPerSecond: number;
  /** How the TypeScript servers ran: built JavaScript, or through ts-node. */
  readonly servers: 'built JavaScript' | 'ts-node';
  readonly notes: readonly string[];
}

const BODY = JSON.stringify({ text: 'Benchmarks measure; tests assert.', notify: 'bench@example.com' });
const PATH = '/v1/summaries';
const BARE = 'bare Nest (no idempotency, no logging)';
const PLAIN = 'plain (our stack, no idempotency)';
export const PEER_DIR = resolve(REPO_ROOT, 'test/bench/peer/nest-anchor');

interface Side {
  readonly name: string;
  readonly server: () => SpawnedServer;
  /** The Idempotency-Key header; `[<id>]` a fresh id per request. */
  readonly key?: string;
  readonly replayed?: boolean;
  /** Before each round (Redis emptied): make the key a replay. */
  readonly prime?: () => Promise<void>;
}

/** Installs the peer's own dependencies when they are missing (a fresh clone): `npm ci` in its folder. */
export function ensurePeerInstalled(): void {
  if (existsSync(resolve(PEER_DIR, 'node_modules/@node-idempotency/nestjs'))) return;
  const npm = resolve(process.execPath, '..', process.platform === 'win32' ? 'npm.cmd' : 'npm');
  execFileSync(existsSync(npm) ? npm : 'npm', ['ci', '--prefix', PEER_DIR, '--no-audit', '--no-fund'], {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, PATH: `${resolve(process.execPath, '..')}:${process.env.PATH ?? ''}` },
  });
}

async function post(url: string, key: string): Promise<void> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'idempotency-key': key },
    body: BODY,
  });
  await res.arrayBuffer();
  if (res.status !== 202) throw new Error(`${url}: priming answered ${res.status}`);
}

const MiB = 1024 * 1024;

export async function benchApiSideBySide(
  redisUrl: string,
  databaseUrl: string,
  options: SideBySideOptions = {},
): Promise<SideBySideResult> {
  const rounds = options.rounds ?? Number(process.env.SIDE_BY_SIDE_ROUNDS ?? 5);
  const seconds = options.secondsPerRound ?? Number(process.env.SIDE_BY_SIDE_SECONDS ?? 5);
  const warmup = options.warmupSeconds ?? 3;
  const connections = options.connections ?? 32;
  ensurePeerInstalled();

  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  await redis.flushdb();
  const common = {
    NODE_ENV: 'production',
    LOG_LEVEL: 'info',
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    API_KEYS: `bench:${KEY}`,
  };
  const servers: SpawnedServer[] = [];
  let load: LoadGenerator | undefined;
  // The .ts servers run as JavaScript built ahead (servers/build.ts), as production runs them;
  // SIDE_BY_SIDE_TS_NODE=1 runs them through ts-node instead.
  const tsNode = process.env.SIDE_BY_SIDE_TS_NODE === '1';
  const built = tsNode ? undefined : buildServers();
  try {
    const start = async (name: string, script: string, env: Record<string, string>, cwd?: string) => {
      const port = await freePort();
      const js = built && script.endsWith('.ts');
      const server = await spawnServer({
        name,
        script: js ? built.jsOf(script) : script,
        nodeArgs: js ? built.nodeArgs : [],
        cwd,
        env: { ...common, ...(js ? built.env : {}), ...env, PORT: String(port) },
        // plain and the api print no ready line on stderr (pino writes to stdout): /metrics answers once they listen.
        ready: cwd === PEER_DIR ? /anchor listening on (\d+)/ : { url: `http://127.0.0.1:${port}/metrics` },
        // SIDE_BY_SIDE_STDOUT_DIR keeps each server's log lines, to see why one stopped; unset they go to /dev/null.
        stdout: process.env.SIDE_BY_SIDE_STDOUT_DIR
          ? { file: resolve(process.env.SIDE_BY_SIDE_STDOUT_DIR, `${name}.log`) }
          : 'ignore',
      });
      servers.push(server);
      return server;
    };
    // One at a time: the machine has two cores, and boots at once slow each other past the timeout.
    const bare = await start('bare', resolve(PEER_DIR, 'server.js'), {}, PEER_DIR);
    const peer = await start('peer', resolve(PEER_DIR, 'server.js'), { PEER_IDEMPOTENCY: '1' }, PEER_DIR);
    const plain = await start('plain', 'test/bench/servers/plain.ts', {});
    const ours = await start('ours', 'test/bench/servers/ours.ts', {});
    const oursSilent = await start('ours-silent', 'test/bench/servers/ours.ts', { LOG_LEVEL: 'silent' });
    load = await startLoadGenerator();
    const idleRss = new Map(servers.map((server) => [server.name, sampleProcess(server.pid).rssBytes]));

    const runId = randomUUID();
    const sides: Side[] = [
      { name: BARE, server: () => bare, key: `bare-${runId}-[<id>]` },
      { name: 'peer first request', server: () => peer, key: `peer-${runId}-[<id>]`, replayed: false },
      {
        name: 'peer replay',
        server: () => peer,
        key: `peer-replay-${runId}`,
        replayed: true,
        prime: () => post(`${peer.url}${PATH}`, `peer-replay-${runId}`),
      },
      { name: PLAIN, server: () => plain, key: `plain-${runId}-[<id>]` },
      { name: 'ours first request', server: () => ours, key: `ours-${runId}-[<id>]`, replayed: false },
      {
        name: 'ours replay',
        server: () => ours,
        key: `ours-replay-${runId}`,
        replayed: true,
        prime: () => post(`${ours.url}${PATH}`, `ours-replay-${runId}`),
      },
      {
        name: 'ours first request, LOG_LEVEL=silent',
        server: () => oursSilent,
        key: `silent-${runId}-[<id>]`,
        replayed: false,
      },
    ];
    const gen = load;
    const runSide = async (side: Side, durationSeconds: number): Promise<LoadResult> => {
      for (const server of servers) server.assertRunning();
      try {
        return await runOnce(side, durationSeconds);
      } catch (err) {
        for (const server of servers) server.assertRunning();
        throw err;
      }
    };
    const runOnce = (side: Side, durationSeconds: number): Promise<LoadResult> =>
      gen.run({
        url: `${side.server().url}${PATH}`,
        headers: {
          authorization: `Bearer ${KEY}`,
          'content-type': 'application/json',
          ...(side.key ? { 'idempotency-key': side.key } : {}),
        },
        body: BODY,
        freshIds: true,
        connections,
        durationSeconds,
        status: 202,
        ...(side.replayed === undefined ? {} : { replayed: side.replayed }),
      });

    // Warm every side (JIT, pools, the scripts loaded into Redis).
    for (const side of sides) {
      await redis.flushdb();
      await side.prime?.();
      await runSide(side, warmup);
    }
    await redis.flushdb();

    // What the idle servers send Redis by themselves (timers, health), per second.
    const idleSeconds = 3;
    const idle0 = await redisCommandCount(redisUrl);
    await new Promise((r) => setTimeout(r, idleSeconds * 1000));
    const idleRate = ((await redisCommandCount(redisUrl)) - idle0) / idleSeconds;

    interface Round {
      load: LoadResult;
      server: MeterReading;
      generator: MeterReading;
      redisCommands: number;
    }
    const byside = new Map<string, Round[]>(sides.map((s) => [s.name, []]));
    for (let r = 0; r < rounds; r++) {
      for (const side of orderOf(sides, r)) {
        await redis.flushdb();
        await side.prime?.();
        const c0 = await redisCommandCount(redisUrl);
        for (const running of servers) running.assertRunning();
        const server = meter(side.server().pid);
        const generator = gen.pid === undefined ? undefined : meter(gen.pid);
        const result = await runSide(side, seconds);
        const s = server.stop();
        const g = generator?.stop() ?? { ...s, cpuMicros: result.generatorCpuMicros ?? 0 };
        // Everything Redis processed meanwhile, whoever sent it (the MONITOR pass below is the servers' own).
        const commands = (await redisCommandCount(redisUrl)) - c0;
        byside.get(side.name)!.push({ load: result, server: s, generator: g, redisCommands: commands });
      }
    }

    // Round trips, counted apart from the timed rounds (MONITOR slows Redis):
    // first what the idle servers send in this database.
    const countSeconds = 2;
    const idleMonitor = await monitorRedis(redisUrl);
    await new Promise((r) => setTimeout(r, idleSeconds * 1000));
    const idleDbRate = (await idleMonitor.stop()).commands / idleSeconds;
    const counted = new Map<string, { perRequest: number; inScripts: number; byCommand: string }>();
    for (const side of sides) {
      await redis.flushdb();
      await side.prime?.();
      const monitor = await monitorRedis(redisUrl);
      const t0 = performance.now();
      const result = await runSide(side, countSeconds);
      await new Promise((r) => setTimeout(r, 300));
      const wallSeconds = (performance.now() - t0) / 1000;
      const seen = await monitor.stop();
      const n = result.requests;
      counted.set(side.name, {
        perRequest: +((seen.commands - idleDbRate * wallSeconds) / n).toFixed(2),
        inScripts: +(seen.inScripts / n).toFixed(2),
        byCommand: Object.entries(seen.byCommand)
          .filter(([, c]) => c / n >= 0.01)
          .sort((a, b) => b[1] - a[1])
          .map(([name, c]) => `${name} ${+(c / n).toFixed(2)}`)
          .join(', '),
      });
    }

    const rows: SideRow[] = sides.map((side) => {
      const rs = byside.get(side.name)!;
      const c = counted.get(side.name)!;
      const perSecond = rs.map((x) => x.load.perSecond);
      const cpu = rs.map((x) => x.server.cpuMicros / x.load.requests);
      const requests = rs.reduce((n, x) => n + x.load.requests, 0);
      return {
        side: side.name,
        rounds: rs.length,
        connections,
        perSecond: Math.round(median(perSecond)),
        perSecondMin: Math.round(Math.min(...perSecond)),
        perSecondMax: Math.round(Math.max(...perSecond)),
        p50Ms: ms(median(rs.map((x) => x.load.p50Ms))),
        p99Ms: ms(median(rs.map((x) => x.load.p99Ms))),
        cpuMicrosPerRequest: Math.round(median(cpu)),
        cpuMicrosPerRequestMin: Math.round(Math.min(...cpu)),
        cpuMicrosPerRequestMax: Math.round(Math.max(...cpu)),
        serverCpuPercent: Math.round(median(rs.map((x) => (100 * x.server.cpuMicros) / x.server.wallMicros))),
        loadGeneratorCpuPercent: Math.round(
          median(rs.map((x) => (100 * x.generator.cpuMicros) / x.generator.wallMicros)),
        ),
        redisCommandsPerRequest: c.perRequest,
        redisCommands: c.byCommand,
        redisCommandsInScriptsPerRequest: c.inScripts,
        redisAllClientsCommandsPerRequest: +(rs.reduce((n, x) => n + x.redisCommands, 0) / requests).toFixed(2),
        peakRssMiB: +(Math.max(...rs.map((x) => x.server.peakRssBytes)) / MiB).toFixed(1),
        idleRssMiB: +(idleRss.get(side.server().name)! / MiB).toFixed(1),
      };
    });

    const ratio = (name: string, over: string, ratioName: string, goal: string): SideRatio => {
      const a = byside.get(name)!;
      const b = byside.get(over)!;
      const each = a.map((x, i) => x.load.perSecond / b[i].load.perSecond);
      const cpuPerRequest = (x: { server: MeterReading; load: LoadResult }) => x.server.cpuMicros / x.load.requests;
      const byCpu = a.map((x, i) => cpuPerRequest(b[i]) / cpuPerRequest(x));
      return {
        ratio: ratioName,
        median: +median(each).toFixed(2),
        min: +Math.min(...each).toFixed(2),
        max: +Math.max(...each).toFixed(2),
        byCpu: +median(byCpu).toFixed(2),
        byCpuMin: +Math.min(...byCpu).toFixed(2),
        byCpuMax: +Math.max(...byCpu).toFixed(2),
        goal,
      };
    };
    const ratios = [
      ratio('ours first request', BARE, 'ours first request / bare Nest', '>= 0.8'),
      ratio('ours first request', 'peer first request', 'ours first request / peer first request', '>= 1.2'),
      ratio('ours replay', BARE, "ours replay / bare Nest's first request", '>= 1.0'),
      ratio('peer first request', BARE, 'peer first request / bare Nest', ''),
      ratio('ours replay', 'peer replay', 'ours replay / peer replay', ''),
      ratio('ours first request', PLAIN, 'ours first request / plain (the cost of idempotency on our stack)', ''),
      ratio(PLAIN, BARE, 'plain / bare Nest (the cost of our stack)', ''),
      ratio('ours first request, LOG_LEVEL=silent', BARE, 'ours first request, silent / bare Nest', ''),
    ];

    const notes: string[] = [];
    const plainRow = rows.find((row) => row.side === PLAIN)!;
    // INFO counts what scripts run inside Redis too: the plain side's own is what it sent plus that.
    const plainOwn = plainRow.redisCommandsPerRequest + plainRow.redisCommandsInScriptsPerRequest;
    if (Math.abs(plainRow.redisAllClientsCommandsPerRequest - plainOwn) > 0.1)
      notes.push(
        `by INFO, Redis processed ${plainRow.redisAllClientsCommandsPerRequest} commands per plain request where ` +
          `plain's own (sent ${plainRow.redisCommandsPerRequest}, in scripts ${plainRow.redisCommandsInScriptsPerRequest}) ` +
          `come to ${+plainOwn.toFixed(2)}: other clients were using this Redis server during the timed rounds, so the ` +
          "INFO column is not the servers' own; the MONITOR columns are",
      );
    for (const row of rows)
      if (row.loadGeneratorCpuPercent >= 90)
        notes.push(
          `${row.side}: the load generator was at ${row.loadGeneratorCpuPercent}% of a core, so may be what limits its req/s`,
        );
    return {
      node: process.version,
      loadGenerator: gen.tool === 'wrk' ? 'wrk, one thread' : 'autocannon, in another process',
      rounds,
      secondsPerRound: seconds,
      connections,
      rows,
      ratios,
      idleRedisCommandsPerSecond: +idleDbRate.toFixed(1),
      idleRedisAllClientsCommandsPerSecond: +idleRate.toFixed(1),
      servers: tsNode ? 'ts-node' : 'built JavaScript',
      notes,
    };
  } finally {
    await load?.stop();
    for (const server of servers.reverse()) await server.stop();
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
    await closeRedisCounters();
  }
}

/** The rows and ratios as console tables. */
export function printApiSideBySide(result: SideBySideResult): void {
  console.log(
    `POST /v1/summaries side by side, each side its own server process, load from ${result.loadGenerator} ` +
      `(${result.connections} connections, keep-alive): medians of ${result.rounds} alternating rounds of ` +
      `${result.secondsPerRound} s, ${result.node}, the Nest 12 servers as ${result.servers}. Idle, the servers sent ${result.idleRedisCommandsPerSecond} Redis commands/s ` +
      `in the bench's database (taken out); the whole Redis server processed ${result.idleRedisAllClientsCommandsPerSecond}/s (other clients, in the INFO column).`,
  );
  console.table(
    result.rows.map((r) => ({
      side: r.side,
      'req/s': r.perSecond,
      'req/s min-max': `${r.perSecondMin}-${r.perSecondMax}`,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      'CPU µs/req': r.cpuMicrosPerRequest,
      'CPU µs/req min-max': `${r.cpuMicrosPerRequestMin}-${r.cpuMicrosPerRequestMax}`,
      'server CPU %': r.serverCpuPercent,
      'load gen CPU %': r.loadGeneratorCpuPercent,
      'Redis cmds/req': r.redisCommandsPerRequest,
      'peak RSS MiB': r.peakRssMiB,
      'idle RSS MiB': r.idleRssMiB,
    })),
  );
  console.log(
    "Redis commands per request: by command (MONITOR, the bench's database only), run inside scripts, and Redis's INFO count over the timed rounds (every client of the server)",
  );
  console.table(
    result.rows.map((r) => ({
      side: r.side,
      'commands/req': r.redisCommandsPerRequest,
      'by command': r.redisCommands,
      'in scripts/req': r.redisCommandsInScriptsPerRequest,
      'INFO, all clients/req': r.redisAllClientsCommandsPerRequest,
    })),
  );
  console.table(
    result.ratios.map((r) => ({
      ratio: r.ratio,
      'req/s: median of rounds': r.median,
      'req/s min-max': `${r.min}-${r.max}`,
      'by CPU µs/req: median': r.byCpu,
      'by CPU min-max': `${r.byCpuMin}-${r.byCpuMax}`,
      goal: r.goal,
    })),
  );
  for (const note of result.notes) console.log(`note: ${note}`);
}

export interface ApiProfileResult {
  /** The sides' names, in column order. */
  readonly sides: readonly string[];
  /** Requests answered in each side's profiled window. */
  readonly requests: readonly number[];
  /** Component → µs per request for each side (same order). */
  readonly components: ReadonlyMap<string, readonly number[]>;
}

/**
 * BENCH=api-profile: where each side's CPU per request goes. Each side is a
 * fresh server process (the same as the side-by-side part's) with a CPU
 * profiler preloaded (profile/window-profile.preload.js), warmed, then
 * profiled over one load window of `seconds` only (not its boot, not its
 * warm-up), and its samples charged to the components of the request's
 * path (profile/components.ts). Sides run one at a time, each alone on the
 * machine but for Redis and the load generator.
 */
export async function benchApiProfile(redisUrl: string, databaseUrl: string, seconds = 8): Promise<ApiProfileResult> {
  ensurePeerInstalled();
  const built = buildServers();
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  const gen = await startLoadGenerator();
  const dir = mkdtempSync(join(tmpdir(), 'llmwf-api-profile-'));
  const runId = randomUUID();
  const sides: {
    name: string;
    script: string;
    cwd?: string;
    env: Record<string, string>;
    key: string;
    replay?: boolean;
  }[] = [
    { name: 'bare Nest', script: resolve(PEER_DIR, 'server.js'), cwd: PEER_DIR, env: {}, key: `bare-${runId}-[<id>]` },
    {
      name: 'peer, first',
      script: resolve(PEER_DIR, 'server.js'),
      cwd: PEER_DIR,
      env: { PEER_IDEMPOTENCY: '1' },
      key: `peer-${runId}-[<id>]`,
    },
    { name: 'plain (our stack)', script: 'test/bench/servers/plain.ts', env: {}, key: `plain-${runId}-[<id>]` },
    { name: 'ours, first', script: 'test/bench/servers/ours.ts', env: {}, key: `ours-${runId}-[<id>]` },
    { name: 'ours, replay', script: 'test/bench/servers/ours.ts', env: {}, key: `replay-${runId}`, replay: true },
  ];
  const columns = new Map<string, number[]>();
  const requests: number[] = [];
  try {
    for (const [i, side] of sides.entries()) {
      await redis.flushdb();
      const out = join(dir, `side-${i}.cpuprofile`);
      const port = await freePort();
      const js = side.script.endsWith('.ts');
      const server = await spawnServer({
        name: side.name,
        script: js ? built.jsOf(side.script) : side.script,
        nodeArgs: [...(js ? built.nodeArgs : []), '-r', WINDOW_PROFILE_PRELOAD],
        ...(side.cwd ? { cwd: side.cwd } : {}),
        env: {
          NODE_ENV: 'production',
          LOG_LEVEL: 'info',
          REDIS_URL: redisUrl,
          DATABASE_URL: databaseUrl,
          API_KEYS: `bench:${KEY}`,
          ...(js ? built.env : {}),
          ...side.env,
          PORT: String(port),
          BENCH_PROFILE_OUT: out,
        },
        ready: side.cwd ? /anchor listening on (\d+)/ : { url: `http://127.0.0.1:${port}/metrics` },
        stdout: 'ignore',
      });
      try {
        if (side.replay) await post(`${server.url}${PATH}`, side.key);
        const spec = {
          url: `${server.url}${PATH}`,
          headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'idempotency-key': side.key },
          body: BODY,
          freshIds: true,
          connections: 32,
          status: 202,
          // Every answer checked to be what the column says: a replay, or a first request (the peer sends no header).
          ...(side.cwd ? {} : { replayed: side.replay === true }),
        };
        const window = await profileWindow(server, gen, spec, seconds, out);
        requests.push(window.requests);
        addColumn(columns, window.components, i, sides.length);
      } finally {
        await server.stop();
      }
    }
  } finally {
    await gen.stop();
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
    rmSync(dir, { recursive: true, force: true });
  }
  return { sides: sides.map((s) => s.name), requests, components: columns };
}

/** The components' table: µs per request, each side a column, largest first for ours. */
export function printApiProfile(result: ApiProfileResult): void {
  console.log(
    `Where CPU per request goes, from a V8 CPU profile of one load window of each side (each server alone, 32 connections, ` +
      `a fresh key per request but for the replay), µs per request; requests in the window: ${result.requests.join(', ')}`,
  );
  printComponents(result.sides, result.components, 'ours, first');
}
