import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { type LoadGenerator, type LoadResult, startLoadGenerator } from './load';
import { freePort, meter, REPO_ROOT, spawnServer, type SpawnedServer } from './processes';
import { addColumn, printComponents, profileWindow, WINDOW_PROFILE_PRELOAD } from './profile/window';
import { buildServers } from './servers/build';
import { median, orderOf } from './support';
import { startFakeModel } from './worker-side-by-side.bench';

/*
 * Issue 22: the gateway beside what users pick instead, in one run, each in
 * a process of its own: the fake model called directly (the floor), the
 * open-source Portkey gateway (@portkey-ai/gateway 1.15.2, its cache off, in
 * test/bench/peer/portkey), and ours (the api as it ships: NODE_ENV=production,
 * LOG_LEVEL=info) without a key, with a fresh Idempotency-Key per request (also
 * with its tenant under a TENANT_TOKEN_LIMITS limit the load never reaches: the
 * limiter's own cost), and replaying one key; beside them the floor, our parts
 * alone (servers/gateway-floor.ts: store, transport, fingerprint, log line, no
 * Nest or Express), a yardstick for a leaner path, not a peer, and the same
 * with the features' per-call work (FLOOR_FEATURES), and with BENCH_FLOOR_IN_OURS=1 that one again inside
 * an idle process of ours. Non-stream POST /v1/chat/completions under autocannon
 * (load.ts: wrk, or autocannon without it; 32 connections), rounds in rotated order, medians: requests per
 * second, p99, and the CPU µs per request of the process in front (for
 * "direct", the fake model's own) and of Redis when it runs here; each ratio
 * to Portkey per round (by rate, and by CPU with Redis's), their median and
 * range. Streams (16 chunks, 2 ms apart) one at a
 * time from this process: time to the first and to the last byte, each
 * side's median over the direct call's.
 */

const PORTKEY_DIR = resolve(REPO_ROOT, 'test/bench/peer/portkey');
const KEY = 'bench-gateway-0123456789abcdef';
const BODY = JSON.stringify({
  model: 'gpt-4.1-mini',
  messages: [{ role: 'user', content: 'Summarise the gateway bench in one line.' }],
});
const STREAM_BODY = JSON.stringify({ ...(JSON.parse(BODY) as object), stream: true });

export interface GatewayPeerRow {
  readonly side: string;
  readonly rounds: number;
  readonly perSecond: number;
  readonly perSecondMin: number;
  readonly perSecondMax: number;
  readonly p99Ms: number;
  readonly cpuMicrosPerRequest: number;
  /** Redis's own CPU a request over the side's rounds (its keys' scripts), when Redis runs on this machine. */
  readonly redisCpuMicrosPerRequest: number | undefined;
  /** Requests per second over Portkey's, the median of the rounds' ratios. */
  readonly overPortkey: number | undefined;
  /** The lowest and highest of those rounds' ratios. */
  readonly overPortkeyMin: number | undefined;
  readonly overPortkeyMax: number | undefined;
  /**
   * Portkey's CPU per request over this side's, Redis's included (Portkey, its cache off, uses none): the median of
   * the rounds' ratios, the steadier measure.
   */
  readonly cpuOverPortkey: number | undefined;
}

export interface GatewayPeerStreamRow {
  readonly side: string;
  readonly streams: number;
  readonly firstByteP50Ms: number;
  readonly lastByteP50Ms: number;
  readonly addedFirstByteMs: number | undefined;
  readonly addedLastByteMs: number | undefined;
}

export interface GatewaySideBySideResult {
  /** What made the load: wrk or autocannon (load.ts). */
  readonly loadGenerator: string;
  readonly calls: GatewayPeerRow[];
  readonly streams: GatewayPeerStreamRow[];
}

interface Side {
  readonly name: string;
  readonly url: () => string;
  readonly headers: () => Record<string, string>;
  /** The process whose CPU a request costs. */
  readonly pid: () => number;
  readonly replayed?: boolean;
  readonly fresh?: boolean;
  readonly prime?: () => Promise<void>;
}

/** Our gateway's environment as the bench runs it (the api as it ships: production, LOG_LEVEL=info). */
function gatewayEnv(port: number, redisUrl: string, databaseUrl: string, modelUrl: string): Record<string, string> {
  return {
    NODE_ENV: 'production',
    LOG_LEVEL: 'info',
    PORT: String(port),
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    API_KEYS: `bench:${KEY}`,
    ADMIN_API_KEY: 'bench-admin-key-0123456789abcdef',
    LLM_PROVIDER: 'openai',
    OPENAI_API_KEY: 'sk-bench',
    OPENAI_BASE_URL: modelUrl,
  };
}

/** Installs Portkey when it is missing (a fresh clone): `npm ci` in its folder (no install scripts run). */
function ensurePortkeyInstalled(): void {
  if (existsSync(resolve(PORTKEY_DIR, 'node_modules/@portkey-ai/gateway/build/start-server.js'))) return;
  const npm = resolve(process.execPath, '..', 'npm');
  execFileSync(existsSync(npm) ? npm : 'npm', ['ci', '--prefix', PORTKEY_DIR, '--no-audit', '--no-fund'], {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, PATH: `${resolve(process.execPath, '..')}:${process.env.PATH ?? ''}` },
  });
}

/** One POST, its answer read whole: the times to its first and last byte, in ms. */
function timedPost(
  url: string,
  headers: Record<string, string>,
  body: string,
): Promise<{ first: number; last: number }> {
  return new Promise((done, fail) => {
    const t0 = performance.now();
    const req = request(url, { method: 'POST', headers: { ...headers, 'content-length': Buffer.byteLength(body) } });
    req.on('error', fail);
    req.on('response', (res) => {
      let first: number | undefined;
      res.on('data', () => (first ??= performance.now() - t0));
      res.on('end', () => {
        if (res.statusCode !== 200) fail(new Error(`${url}: ${res.statusCode}`));
        else done({ first: first ?? performance.now() - t0, last: performance.now() - t0 });
      });
      res.on('error', fail);
    });
    req.end(body);
  });
}

export async function benchGatewaySideBySide(
  redisUrl: string,
  databaseUrl: string,
  options: { rounds?: number; secondsPerRound?: number; streamsPerRound?: number } = {},
): Promise<GatewaySideBySideResult> {
  const rounds = options.rounds ?? 5;
  const seconds = options.secondsPerRound ?? 5;
  const streamsPerRound = options.streamsPerRound ?? 40;
  ensurePortkeyInstalled();
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  await redis.flushdb();
  const servers: SpawnedServer[] = [];
  let load: LoadGenerator | undefined;
  const built = buildServers();
  try {
    const model = await startFakeModel(0);
    servers.push(model);
    const portkeyPort = await freePort();
    const portkey = await spawnServer({
      name: 'portkey',
      script: resolve(PORTKEY_DIR, 'node_modules/@portkey-ai/gateway/build/start-server.js'),
      nodeArgs: ['--import', resolve(PORTKEY_DIR, 'loopback.mjs')],
      args: [`--port=${portkeyPort}`, '--headless'],
      cwd: PORTKEY_DIR,
      env: { NODE_ENV: 'production' },
      ready: { url: `http://127.0.0.1:${portkeyPort}/` },
      stdout: 'ignore',
    });
    servers.push(portkey);
    const startOurs = async (name: string, extra: Record<string, string>) => {
      const port = await freePort();
      const server = await spawnServer({
        name,
        script: built.jsOf('test/bench/servers/ours.ts'),
        nodeArgs: built.nodeArgs,
        env: {
          ...built.env,
          ...gatewayEnv(port, redisUrl, databaseUrl, model.url!),
          ...extra,
        },
        ready: { url: `http://127.0.0.1:${port}/metrics` },
        stdout: 'ignore',
      });
      servers.push(server);
      return server;
    };
    const ours = await startOurs('ours', {});
    // Our parts without Nest or Express (servers/gateway-floor.ts): how far a leaner path could go, not a product;
    // with FLOOR_FEATURES, also the per-call work of the features the floor leaves out.
    const startFloor = async (name: string, extra: Record<string, string>) => {
      const port = await freePort();
      const server = await spawnServer({
        name,
        script: built.jsOf('test/bench/servers/gateway-floor.ts'),
        nodeArgs: built.nodeArgs,
        env: {
          ...built.env,
          NODE_ENV: 'production',
          PORT: String(port),
          REDIS_URL: redisUrl,
          API_KEYS: `bench:${KEY}`,
          OPENAI_API_KEY: 'sk-bench',
          OPENAI_BASE_URL: model.url!,
          ...extra,
        },
        ready: /gateway floor listening on (\d+)/,
        stdout: 'ignore',
      });
      servers.push(server);
      return server;
    };
    const floor = await startFloor('floor', {});
    const featuredFloor = await startFloor('floor with the features', { FLOOR_FEATURES: '1' });
    // BENCH_FLOOR_IN_OURS=1: the same floor inside a process of ours that serves nothing meanwhile
    // (servers/ours-with-floor.ts): its cost where ours' code and heap are loaded.
    let floorInOurs: { readonly server: SpawnedServer; readonly url: string } | undefined;
    if (process.env.BENCH_FLOOR_IN_OURS === '1') {
      const [port, floorPort] = [await freePort(), await freePort()];
      const server = await spawnServer({
        name: 'ours with the floor',
        script: built.jsOf('test/bench/servers/ours-with-floor.ts'),
        nodeArgs: built.nodeArgs,
        env: {
          ...built.env,
          ...gatewayEnv(port, redisUrl, databaseUrl, model.url!),
          FLOOR_PORT: String(floorPort),
          FLOOR_FEATURES: '1',
        },
        // The floor listens once its Redis client is connected, before the api's start is over; a floor not
        // listening yet would fail the warm-up loudly rather than give a number.
        ready: { url: `http://127.0.0.1:${port}/metrics` },
        stdout: 'ignore',
      });
      servers.push(server);
      floorInOurs = { server, url: `http://127.0.0.1:${floorPort}/v1/chat/completions` };
    }
    // The same, its tenant under a token limit none of the load reaches (issue 23): the limiter's own cost.
    const limited = await startOurs('ours, limited', { TENANT_TOKEN_LIMITS: 'bench=1000000000000/1d' });
    load = await startLoadGenerator();

    const runId = randomUUID();
    const json = { 'content-type': 'application/json' };
    const ourHeaders = { ...json, authorization: `Bearer ${KEY}` };
    const at = (server: SpawnedServer) => `${server.url!}/v1/chat/completions`;
    // A gateway of ours (or the floor) without a key, with a fresh key per request, and replaying one key.
    const keyless = (name: string, server: SpawnedServer): Side => ({
      name,
      url: () => at(server),
      headers: () => ourHeaders,
      pid: () => server.pid,
    });
    const freshKeys = (name: string, server: SpawnedServer, prefix: string): Side => ({
      ...keyless(name, server),
      headers: () => ({ ...ourHeaders, 'idempotency-key': `${prefix}-[<id>]` }),
      fresh: true,
      replayed: false,
    });
    const replaying = (name: string, server: SpawnedServer, key: string): Side => ({
      ...keyless(name, server),
      headers: () => ({ ...ourHeaders, 'idempotency-key': key }),
      replayed: true,
      prime: async () => {
        await timedPost(at(server), { ...ourHeaders, 'idempotency-key': key }, BODY);
      },
    });
    const sides: Side[] = [
      {
        name: 'direct (the fake model)',
        url: () => `${model.url!}/chat/completions`,
        headers: () => ({ ...json, authorization: 'Bearer sk-bench' }),
        pid: () => model.pid,
      },
      {
        name: 'Portkey 1.15.2 (cache off)',
        url: () => `${portkey.url!}/v1/chat/completions`,
        headers: () => ({
          ...json,
          authorization: 'Bearer sk-bench',
          'x-portkey-provider': 'openai',
          'x-portkey-custom-host': model.url!,
        }),
        pid: () => portkey.pid,
      },
      keyless('ours, no key', ours),
      freshKeys('ours, a fresh key each', ours, `gw-${runId}`),
      freshKeys('ours, a fresh key each, tenant token limit set', limited, `gw-limited-${runId}`),
      replaying('ours, replay', ours, `gw-replay-${runId}`),
      keyless('floor (our parts, no Nest or Express), no key', floor),
      freshKeys('floor, a fresh key each', floor, `gw-floor-${runId}`),
      replaying('floor, replay', floor, `gw-floor-replay-${runId}`),
      freshKeys('floor with the features, a fresh key each', featuredFloor, `gw-featured-${runId}`),
      ...(floorInOurs === undefined
        ? []
        : [
            {
              ...freshKeys(
                'floor with the features, inside an idle process of ours',
                floorInOurs.server,
                `gw-fio-${runId}`,
              ),
              url: () => floorInOurs.url,
            },
          ]),
    ];
    const gen = load;
    const run = (side: Side, durationSeconds: number): Promise<LoadResult> => {
      for (const server of servers) server.assertRunning();
      return gen.run({
        url: side.url(),
        headers: side.headers(),
        body: BODY,
        freshIds: side.fresh === true,
        connections: 32,
        durationSeconds,
        status: 200,
        ...(side.replayed === undefined ? {} : { replayed: side.replayed }),
      });
    };
    for (const side of sides) {
      await side.prime?.();
      await run(side, 3);
    }
    // Redis's process, when it runs here: a keyed call's scripts cost CPU there too, which a fair comparison counts.
    const redisPid = Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1]);
    const redisHere = Number.isInteger(redisPid) && existsSync(`/proc/${redisPid}/stat`);
    type Round = { load: LoadResult; cpuMicros: number; redisMicros: number | undefined };
    const results = new Map<string, Round[]>(sides.map((s) => [s.name, []]));
    for (let r = 0; r < rounds; r++) {
      for (const side of orderOf(sides, r)) {
        await redis.flushdb();
        await side.prime?.();
        const m = meter(side.pid());
        const redisMeter = redisHere ? meter(redisPid) : undefined;
        const result = await run(side, seconds);
        results
          .get(side.name)!
          .push({ load: result, cpuMicros: m.stop().cpuMicros, redisMicros: redisMeter?.stop().cpuMicros });
      }
    }
    const portkeyRounds = results.get(sides[1].name)!;
    const perRequest = (x: Round): number => x.cpuMicros / x.load.requests;
    const redisPerRequest = (x: Round): number => (x.redisMicros ?? 0) / x.load.requests;
    const withRedis = (x: Round): number => perRequest(x) + redisPerRequest(x);
    const calls = sides.map((side): GatewayPeerRow => {
      const rs = results.get(side.name)!;
      const perSecond = rs.map((x) => x.load.perSecond);
      const peer = side === sides[1] || side === sides[0];
      const rateRatios = rs.map((x, i) => x.load.perSecond / portkeyRounds[i].load.perSecond);
      const cpuRatios = rs.map((x, i) => withRedis(portkeyRounds[i]) / withRedis(x));
      return {
        side: side.name,
        rounds: rs.length,
        perSecond: Math.round(median(perSecond)),
        perSecondMin: Math.round(Math.min(...perSecond)),
        perSecondMax: Math.round(Math.max(...perSecond)),
        p99Ms: +median(rs.map((x) => x.load.p99Ms)).toFixed(1),
        cpuMicrosPerRequest: Math.round(median(rs.map(perRequest))),
        redisCpuMicrosPerRequest: redisHere ? Math.round(median(rs.map(redisPerRequest))) : undefined,
        overPortkey: peer ? undefined : +median(rateRatios).toFixed(2),
        overPortkeyMin: peer ? undefined : +Math.min(...rateRatios).toFixed(2),
        overPortkeyMax: peer ? undefined : +Math.max(...rateRatios).toFixed(2),
        cpuOverPortkey: peer ? undefined : +median(cpuRatios).toFixed(2),
      };
    });

    // Streams, one at a time: the fake model called directly, Portkey, ours without and with a key.
    const streamSides = sides.slice(0, 4);
    const timings = new Map<string, { first: number; last: number }[][]>(streamSides.map((s) => [s.name, []]));
    for (let r = 0; r < rounds; r++) {
      for (const side of orderOf(streamSides, r)) {
        const round: { first: number; last: number }[] = [];
        for (let i = 0; i < streamsPerRound; i++) {
          const headers = side.headers();
          if (side.fresh) headers['idempotency-key'] = `gw-stream-${runId}-${r}-${i}`;
          round.push(await timedPost(side.url(), headers, STREAM_BODY));
        }
        timings.get(side.name)!.push(round);
      }
    }
    const roundMedian = (rs: { first: number; last: number }[][], pick: 'first' | 'last') =>
      rs.map((round) => median(round.map((t) => t[pick])));
    const direct = timings.get(streamSides[0].name)!;
    const streams = streamSides.map((side, i): GatewayPeerStreamRow => {
      const rs = timings.get(side.name)!;
      const added = (pick: 'first' | 'last') =>
        i === 0 ? undefined : +median(roundMedian(rs, pick).map((v, r) => v - roundMedian(direct, pick)[r])).toFixed(2);
      return {
        side: side.name,
        streams: rs.length * streamsPerRound,
        firstByteP50Ms: +median(roundMedian(rs, 'first')).toFixed(2),
        lastByteP50Ms: +median(roundMedian(rs, 'last')).toFixed(2),
        addedFirstByteMs: added('first'),
        addedLastByteMs: added('last'),
      };
    });
    return { loadGenerator: gen.tool, calls, streams };
  } finally {
    await load?.stop();
    for (const server of servers.reverse()) await server.stop();
    redis.disconnect();
  }
}

export function printGatewaySideBySide(result: GatewaySideBySideResult): void {
  console.log(
    `POST /v1/chat/completions side by side, each side its own process, load from ${result.loadGenerator} (32 connections) in another: medians of alternating rounds`,
  );
  console.table(
    result.calls.map((r) => ({
      side: r.side,
      rounds: r.rounds,
      'req/s': r.perSecond,
      'req/s min-max': `${r.perSecondMin}-${r.perSecondMax}`,
      '/ Portkey': r.overPortkey ?? '',
      '/ Portkey min-max': r.overPortkey === undefined ? '' : `${r.overPortkeyMin}-${r.overPortkeyMax}`,
      'p99 ms': r.p99Ms,
      'CPU µs/req': r.cpuMicrosPerRequest,
      'Redis CPU µs/req': r.redisCpuMicrosPerRequest ?? '',
      'CPU with Redis: Portkey / side': r.cpuOverPortkey ?? '',
    })),
  );
  console.log(
    'Streams (16 chunks, 2 ms apart), one at a time: medians, and what each side adds to calling the model directly',
  );
  console.table(
    result.streams.map((r) => ({
      side: r.side,
      streams: r.streams,
      'first byte p50 ms': r.firstByteP50Ms,
      'last byte p50 ms': r.lastByteP50Ms,
      'added first byte ms': r.addedFirstByteMs ?? '',
      'added last byte ms': r.addedLastByteMs ?? '',
    })),
  );
}

export interface GatewayProfileResult {
  readonly sides: readonly string[];
  /** Requests answered in each side's profiled window. */
  readonly requests: readonly number[];
  /** Component → µs per request for each side (same order). */
  readonly components: ReadonlyMap<string, readonly number[]>;
}

/**
 * BENCH=gateway-profile: where a gateway call's CPU goes, ours beside the floor
 * (servers/gateway-floor.ts). Each side a fresh server alone on the machine
 * with the fake model, a V8 CPU profile of one load window after a warm-up
 * (profile/window-profile.preload.js), each sample charged to the innermost
 * component of its stack (profile/components.ts).
 */
export async function benchGatewayProfile(
  redisUrl: string,
  databaseUrl: string,
  seconds = 8,
): Promise<GatewayProfileResult> {
  const built = buildServers();
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  // BENCH_CPU_PROF=<dir>: the profiles stay there (side-<n>.cpuprofile, in the sides' order) for a closer look.
  const kept = process.env.BENCH_CPU_PROF;
  if (kept) mkdirSync(kept, { recursive: true });
  const dir = kept ?? mkdtempSync(join(tmpdir(), 'llmwf-gateway-profile-'));
  let gen: LoadGenerator | undefined;
  let model: SpawnedServer | undefined;
  const runId = randomUUID();
  const sides = [
    { name: 'ours, no key', script: 'test/bench/servers/ours.ts', key: undefined, replay: false },
    { name: 'ours, a fresh key', script: 'test/bench/servers/ours.ts', key: `ours-${runId}-[<id>]`, replay: false },
    { name: 'ours, replay', script: 'test/bench/servers/ours.ts', key: `ours-replay-${runId}`, replay: true },
    {
      name: 'floor, a fresh key',
      script: 'test/bench/servers/gateway-floor.ts',
      key: `f-${runId}-[<id>]`,
      replay: false,
    },
    { name: 'floor, replay', script: 'test/bench/servers/gateway-floor.ts', key: `f-replay-${runId}`, replay: true },
  ];
  const columns = new Map<string, number[]>();
  const requests: number[] = [];
  try {
    gen = await startLoadGenerator();
    model = await startFakeModel(0);
    for (const [i, side] of sides.entries()) {
      await redis.flushdb();
      const out = join(dir, `side-${i}.cpuprofile`);
      // A kept directory may hold an earlier run's: never read that one in place of this run's.
      rmSync(out, { force: true });
      const port = await freePort();
      const floor = side.script.endsWith('gateway-floor.ts');
      const server = await spawnServer({
        name: side.name,
        script: built.jsOf(side.script),
        nodeArgs: [...built.nodeArgs, '-r', WINDOW_PROFILE_PRELOAD],
        env: {
          ...built.env,
          ...gatewayEnv(port, redisUrl, databaseUrl, model.url!),
          BENCH_PROFILE_OUT: out,
        },
        ready: floor ? /gateway floor listening on (\d+)/ : { url: `http://127.0.0.1:${port}/metrics` },
        stdout: 'ignore',
      });
      try {
        const url = `${server.url}/v1/chat/completions`;
        const headers: Record<string, string> = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
        if (side.key !== undefined) headers['idempotency-key'] = side.key;
        if (side.replay) await timedPost(url, headers, BODY);
        const spec = {
          url,
          headers,
          body: BODY,
          freshIds: side.key !== undefined && !side.replay,
          connections: 32,
          status: 200,
          ...(side.key === undefined ? {} : { replayed: side.replay }),
        };
        const window = await profileWindow(server, gen, spec, seconds, out);
        requests.push(window.requests);
        addColumn(columns, window.components, i, sides.length);
      } finally {
        await server.stop();
      }
    }
  } finally {
    await gen?.stop();
    await model?.stop();
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
    if (!kept) rmSync(dir, { recursive: true, force: true });
  }
  return { sides: sides.map((s) => s.name), requests, components: columns };
}

/** The components' table: µs per request, each side a column, largest first for ours with a fresh key. */
export function printGatewayProfile(result: GatewayProfileResult): void {
  console.log(
    `POST /v1/chat/completions: where CPU per request goes, from a V8 CPU profile of one load window of each side ` +
      `(each server alone with the fake model, 32 connections), µs per request; requests in the window: ` +
      result.requests.join(', '),
  );
  printComponents(result.sides, result.components, 'ours, a fresh key');
}
