import { REDIS_CLIENT } from '@app/redis';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { Agent, createServer, type OutgoingHttpHeaders, request, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp } from '../../apps/api/src/create-api-app';
import { completionEvents } from '../support/fake-openai-server';
import { countRedisCommands, median, ms, orderOf, percentile } from './support';

/*
 * POST /v1/chat/completions against the provider it forwards to, side by
 * side in one run: the client calls the provider directly, or through the
 * gateway without a key, with a new key (claim + store) or with a stored key
 * (replay). Rounds alternate the order of the sides; each figure is the median
 * of the rounds' figures, an "added" one the median of the rounds'
 * differences to direct. Client, api and provider share this process (and
 * one HTTP agent), so "added" is the api's own work plus one loopback hop.
 */

export interface GatewayCallRow {
  readonly side: string;
  readonly requests: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly addedP50Ms: number | undefined;
  readonly addedP99Ms: number | undefined;
  /** Commands the api's Redis client sent per request (its blocking connection aside). */
  readonly redisRoundTripsPerRequest: number;
}

export interface GatewayStreamRow {
  readonly side: string;
  readonly streams: number;
  /** Request sent to the first chunk with content (not the role chunk) received. */
  readonly ttftP50Ms: number;
  readonly ttftP99Ms: number;
  readonly addedTtftP50Ms: number | undefined;
  readonly addedTtftP99Ms: number | undefined;
  readonly lastByteP50Ms: number;
  readonly lastByteP99Ms: number;
  /** A replay's time to last byte over that of the stream it replays (the new-key side): below 1 is faster. */
  readonly replayOverOriginal: number | undefined;
  readonly redisRoundTripsPerRequest: number;
}

export interface GatewayThroughputRow {
  readonly side: string;
  readonly requests: number;
  readonly concurrency: number;
  readonly perSecond: number;
  readonly p50Ms: number;
}

export interface GatewayMemoryRow {
  readonly phase: string;
  readonly readers: number;
  readonly streamMb: number;
  /** What the api would hold if it gathered each reader's stream whole first. */
  readonly gatheredMb: number;
  /** Peak of heapUsed + arrayBuffers after a full GC, over the phase's start. */
  readonly retainedPeakMb: number;
  readonly rssGrowthMb: number;
  readonly readerSeconds: number;
  readonly upstreamCalls: number;
}

export interface GatewayBenchResults {
  readonly calls: GatewayCallRow[];
  readonly streams: GatewayStreamRow[];
  readonly throughput: GatewayThroughputRow[];
  readonly memory: GatewayMemoryRow[];
}

const KEY = 'bench-gateway-0123456789abcdef';
const PATH = '/v1/chat/completions';
const ROUNDS = 5;
const PACE_MS = 5;
const SIDES = ['direct', 'no key', 'new key', 'replay'] as const;
type Side = (typeof SIDES)[number];

/** The provider answers by the model the body names (the gateway sends the body upstream as it is). */
const MODEL = {
  plain: 'bench',
  paced: 'bench-paced',
  large: 'bench-large',
  larger: 'bench-larger',
  largeSlow: 'bench-large-slow',
} as const;
/**
 * Events of the large stream (~1.5 MB); the larger one has twice as many, to tell retention per reader from retention
 * per stream.
 */
const LARGE_EVENTS = 2000;
const SLOW_READERS = 20;
const SLOW_READ_BYTES_PER_S = 1024 * 1024;
/** The first chunk that carries content: the role chunk before it has `{"role":"assistant","content":""}`. */
const FIRST_TOKEN = '"delta":{"content":"';

const ask = (model: string, stream: boolean): Buffer =>
  Buffer.from(
    JSON.stringify({
      model,
      messages: [{ role: 'user', content: 'Benchmarks measure; tests assert.' }],
      ...(stream ? { stream: true } : {}),
    }),
  );

interface Provider {
  readonly port: number;
  /** The answer's bytes, by the model asked for (`stream` for the small stream, paced or not). */
  readonly sizes: {
    readonly completion: number;
    readonly stream: number;
    readonly large: number;
    readonly larger: number;
  };
  calls: number;
  close(): Promise<void>;
}

/**
 * The model provider, as cheap as it can be: answers precomputed, written at
 * once (a chat.completion; a stream of 20 chunk events and [DONE] in one
 * write), or paced for the cases where time between chunks matters.
 */
async function startProvider(): Promise<Provider> {
  const completion = Buffer.from(
    JSON.stringify({
      id: 'chatcmpl-bench',
      object: 'chat.completion',
      created: 1_700_000_000,
      model: MODEL.plain,
      choices: [
        { index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'A short answer of a few words.' } },
      ],
      usage: { prompt_tokens: 7, completion_tokens: 7, total_tokens: 14 },
    }),
  );
  // role chunk + 18 words + stop chunk = 20 chunk events, then [DONE].
  const events = completionEvents(Array.from({ length: 18 }, (_, i) => `word${i} `).join(''), {
    id: 'chatcmpl-bench',
    model: MODEL.plain,
  });
  const stream = Buffer.from(events.join(''));
  const bigEvents = (n: number) =>
    completionEvents(Array.from({ length: n - 3 }, (_, i) => `${'x'.repeat(580)}${i} `).join(''), {
      id: 'chatcmpl-large',
      model: MODEL.large,
    });
  const largeEvents = bigEvents(LARGE_EVENTS);
  const large = Buffer.from(largeEvents.join(''));
  const larger = Buffer.from(bigEvents(2 * LARGE_EVENTS).join(''));
  const sse = { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' };

  const paced = (res: ServerResponse, all: readonly string[], perWrite: number, everyMs: number): void => {
    let i = 0;
    const next = (): void => {
      if (res.destroyed) return;
      res.write(all.slice(i, i + perWrite).join(''));
      i += perWrite;
      if (i >= all.length) res.end();
      else setTimeout(next, everyMs);
    };
    next();
  };

  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      provider.calls++;
      const raw = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
      if (!raw.includes('"stream":true')) {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': completion.length }).end(completion);
        return;
      }
      res.writeHead(200, sse);
      if (raw.includes(`"model":"${MODEL.paced}"`)) paced(res, events, 1, PACE_MS);
      else if (raw.includes(`"model":"${MODEL.largeSlow}"`)) paced(res, largeEvents, 50, 25);
      else if (raw.includes(`"model":"${MODEL.larger}"`)) res.end(larger);
      else res.end(raw.includes(`"model":"${MODEL.large}"`) ? large : stream);
    });
  });
  // Longer than any pause of the bench: no kept-alive socket is closed under the gateway.
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const provider: Provider = {
    port: (server.address() as AddressInfo).port,
    sizes: { completion: completion.length, stream: stream.length, large: large.length, larger: larger.length },
    calls: 0,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
  return provider;
}

interface Target {
  readonly port: number;
  readonly authorization: string;
}

interface Answer {
  readonly status: number;
  readonly replayed: boolean;
  readonly firstTokenMs: number;
  readonly lastByteMs: number;
  readonly bytes: number;
}

/** The one client of every side: node:http on one kept-alive agent. */
const agent = new Agent({ keepAlive: true, maxSockets: 64 });

/** One call; `readBytesPerSecond` makes a slow reader, one that never reads ahead of that rate. */
function call(target: Target, body: Buffer, key: string | undefined, readBytesPerSecond?: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: OutgoingHttpHeaders = {
      authorization: target.authorization,
      'content-type': 'application/json',
      'content-length': body.length,
    };
    if (key !== undefined) headers['idempotency-key'] = key;
    const t0 = performance.now();
    const req = request({ host: '127.0.0.1', port: target.port, path: PATH, method: 'POST', agent, headers }, (res) => {
      let firstTokenMs = Number.NaN;
      let tail = '';
      let bytes = 0;
      res.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        if (Number.isNaN(firstTokenMs)) {
          const text = tail + chunk.toString('latin1');
          if (text.includes(FIRST_TOKEN)) firstTokenMs = performance.now() - t0;
          else tail = text.slice(-FIRST_TOKEN.length);
        }
        if (readBytesPerSecond !== undefined) {
          // Paused until the bytes read so far are due at this rate (timers are too coarse for a wait per small chunk).
          const wait = t0 + (bytes / readBytesPerSecond) * 1000 - performance.now();
          if (wait >= 1) {
            res.pause();
            setTimeout(() => res.resume(), wait);
          }
        }
      });
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          replayed: res.headers['idempotent-replayed'] === 'true',
          firstTokenMs,
          lastByteMs: performance.now() - t0,
          bytes,
        }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

const mb = (bytes: number): number => +(bytes / 1024 / 1024).toFixed(1);

interface RoundStats {
  readonly ttftP50: number;
  readonly ttftP99: number;
  readonly lastP50: number;
  readonly lastP99: number;
}

function statsOf(answers: readonly Answer[]): RoundStats {
  const ttft = answers.map((a) => a.firstTokenMs).sort((a, b) => a - b);
  const last = answers.map((a) => a.lastByteMs).sort((a, b) => a - b);
  return {
    ttftP50: percentile(ttft, 0.5),
    ttftP99: percentile(ttft, 0.99),
    lastP50: percentile(last, 0.5),
    lastP99: percentile(last, 0.99),
  };
}

/** The rounds' figures of one side: per-round stats, and the Redis commands and requests they took. */
interface SideTally {
  readonly rounds: RoundStats[];
  requests: number;
  commands: number;
}

const tallies = (): Record<Side, SideTally> =>
  Object.fromEntries(SIDES.map((s) => [s, { rounds: [], requests: 0, commands: 0 }])) as unknown as Record<
    Side,
    SideTally
  >;

/** Median over rounds of `pick(side) - pick(direct)` in the same round. */
const added = (t: Record<Side, SideTally>, side: Side, pick: (s: RoundStats) => number): number | undefined =>
  side === 'direct' ? undefined : ms(median(t[side].rounds.map((s, r) => pick(s) - pick(t.direct.rounds[r]))));

const exposeGc = (): (() => void) => {
  // A full GC on demand, to measure what the api retains rather than garbage not yet collected.
  setFlagsFromString('--expose-gc');
  return runInNewContext('gc') as () => void;
};

export async function benchGateway(redisUrl: string, databaseUrl: string): Promise<GatewayBenchResults> {
  const provider = await startProvider();
  const config = loadApiConfig({
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    API_KEYS: `bench:${KEY}`,
    LLM_PROVIDER: 'openai',
    OPENAI_API_KEY: 'sk-bench',
    OPENAI_BASE_URL: `http://127.0.0.1:${provider.port}/v1`,
  });
  const app = (await createApiApp(ApiModule.forRoot(config))) as NestExpressApplication;
  await app.listen(0, '127.0.0.1');
  const api: Target = { port: (app.getHttpServer().address() as AddressInfo).port, authorization: `Bearer ${KEY}` };
  const direct: Target = { port: provider.port, authorization: 'Bearer sk-bench' };
  const redis = app.get<Redis>(REDIS_CLIENT);
  await redis.flushdb();

  let commands = 0;
  const uncount = countRedisCommands(redis, () => commands++);

  const runId = randomUUID();
  let seq = 0;
  const newKey = () => `gw-${runId}-${seq++}`;
  const bodies = {
    plain: ask(MODEL.plain, false),
    stream: ask(MODEL.plain, true),
    paced: ask(MODEL.paced, true),
    large: ask(MODEL.large, true),
    larger: ask(MODEL.larger, true),
    largeSlow: ask(MODEL.largeSlow, true),
  };
  const sizes = new Map<Buffer, number>([
    [bodies.plain, provider.sizes.completion],
    [bodies.stream, provider.sizes.stream],
    [bodies.paced, provider.sizes.stream],
    [bodies.large, provider.sizes.large],
    [bodies.larger, provider.sizes.larger],
    [bodies.largeSlow, provider.sizes.large],
  ]);
  const expectedBytes = (body: Buffer): number => sizes.get(body)!;

  const check = (a: Answer, side: Side | 'attached', body: Buffer): void => {
    const replayed = side === 'replay' || side === 'attached';
    if (a.status !== 200 || a.replayed !== replayed || a.bytes !== expectedBytes(body)) {
      throw new Error(
        `${side}: status ${a.status}, replayed ${a.replayed}, ${a.bytes} bytes (expected ${expectedBytes(body)})`,
      );
    }
  };

  /** A stored answer per body for the replay side, made once. */
  const replayKeys = new Map<Buffer, string>();
  const replayKeyOf = async (body: Buffer): Promise<string> => {
    let key = replayKeys.get(body);
    if (key === undefined) {
      key = newKey();
      check(await call(api, body, key), 'new key', body);
      replayKeys.set(body, key);
    }
    return key;
  };

  const runSide = async (side: Side, body: Buffer, n: number, tally?: SideTally): Promise<Answer[]> => {
    const replayKey = side === 'replay' ? await replayKeyOf(body) : undefined;
    const target = side === 'direct' ? direct : api;
    const callsBefore = provider.calls;
    const before = commands;
    const answers: Answer[] = [];
    for (let i = 0; i < n; i++) {
      const a = await call(target, body, side === 'new key' ? newKey() : replayKey);
      check(a, side, body);
      answers.push(a);
    }
    if (side === 'replay' && provider.calls !== callsBefore) throw new Error('a replay called the provider');
    if (tally) {
      tally.commands += commands - before;
      tally.requests += n;
      tally.rounds.push(statsOf(answers));
    }
    return answers;
  };

  const concurrent = async (
    side: 'direct' | 'new key',
    total: number,
    concurrency: number,
  ): Promise<{ perSecond: number; p50: number }> => {
    const latencies: number[] = [];
    let next = 0;
    const worker = async () => {
      while (next++ < total) {
        const a = await call(side === 'direct' ? direct : api, bodies.plain, side === 'new key' ? newKey() : undefined);
        check(a, side, bodies.plain);
        latencies.push(a.lastByteMs);
      }
    };
    const t0 = performance.now();
    await Promise.all(Array.from({ length: concurrency }, worker));
    const seconds = (performance.now() - t0) / 1000;
    return {
      perSecond: total / seconds,
      p50: percentile(
        latencies.sort((a, b) => a - b),
        0.5,
      ),
    };
  };

  /**
   * SLOW_READERS callers reading one large stream slowly while a full GC runs
   * every 100 ms: what the api retains, against what it would hold if it
   * gathered each stream whole before sending it.
   */
  const memoryPhase = async (
    phase: string,
    streamBytes: number,
    readers: () => Promise<Answer[]>,
  ): Promise<GatewayMemoryRow> => {
    const gc = exposeGc();
    // Buffers (socket writes, Redis replies) are outside the JS heap: counted as arrayBuffers.
    const retained = (): number => {
      gc();
      const m = process.memoryUsage();
      return m.heapUsed + m.arrayBuffers;
    };
    // A first full GC after a busy phase leaves some for the next one: the baseline is the lowest of a few.
    let base = Number.POSITIVE_INFINITY;
    for (let i = 0; i < 3; i++) {
      base = Math.min(base, retained());
      await new Promise((r) => setImmediate(r));
    }
    const baseRss = process.memoryUsage().rss;
    let retainedPeak = Number.NEGATIVE_INFINITY;
    let rssPeak = baseRss;
    const sample = (): void => {
      retainedPeak = Math.max(retainedPeak, retained() - base);
      rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
    };
    const timer = setInterval(sample, 100);
    const callsBefore = provider.calls;
    let answers: Answer[];
    try {
      answers = await readers();
    } finally {
      clearInterval(timer);
    }
    sample(); // a phase shorter than one interval still has its figure
    return {
      phase,
      readers: SLOW_READERS,
      streamMb: mb(streamBytes),
      gatheredMb: mb(SLOW_READERS * streamBytes),
      retainedPeakMb: mb(retainedPeak),
      rssGrowthMb: mb(rssPeak - baseRss),
      readerSeconds: +(median(answers.map((a) => a.lastByteMs)) / 1000).toFixed(2),
      upstreamCalls: provider.calls - callsBefore,
    };
  };

  const slowReaders = (key: string, body: Buffer): Promise<Answer[]> =>
    Promise.all(
      Array.from({ length: SLOW_READERS }, async () => {
        const a = await call(api, body, key, SLOW_READ_BYTES_PER_S);
        check(a, 'attached', body);
        return a;
      }),
    );

  try {
    // Warm-up: JIT, connections, the replay records.
    for (const side of SIDES) {
      await runSide(side, bodies.plain, 200);
      await runSide(side, bodies.stream, 200);
      await runSide(side, bodies.paced, 2);
    }
    await concurrent('direct', 500, 16);
    await concurrent('new key', 500, 16);

    const plain = tallies();
    const stream = tallies();
    const paced = tallies();
    const c16: Record<'direct' | 'new key', { perSecond: number; p50: number }[]> = { direct: [], 'new key': [] };
    for (let r = 0; r < ROUNDS; r++) {
      for (const side of orderOf(SIDES, r)) await runSide(side, bodies.plain, 300, plain[side]);
      for (const side of orderOf(SIDES, r)) await runSide(side, bodies.stream, 200, stream[side]);
      for (const side of orderOf(SIDES, r)) await runSide(side, bodies.paced, 12, paced[side]);
      for (const side of orderOf(['direct', 'new key'] as const, r)) c16[side].push(await concurrent(side, 1000, 16));
    }

    const roundTrips = (t: SideTally) => +(t.commands / t.requests).toFixed(2);
    const calls: GatewayCallRow[] = SIDES.map((side) => ({
      side: `non-stream, ${side}`,
      requests: plain[side].requests,
      p50Ms: ms(median(plain[side].rounds.map((s) => s.lastP50))),
      p99Ms: ms(median(plain[side].rounds.map((s) => s.lastP99))),
      addedP50Ms: added(plain, side, (s) => s.lastP50),
      addedP99Ms: added(plain, side, (s) => s.lastP99),
      redisRoundTripsPerRequest: roundTrips(plain[side]),
    }));
    const streamRows = (name: string, t: Record<Side, SideTally>): GatewayStreamRow[] =>
      SIDES.map((side) => ({
        side: `${name}, ${side}`,
        streams: t[side].requests,
        ttftP50Ms: ms(median(t[side].rounds.map((s) => s.ttftP50))),
        ttftP99Ms: ms(median(t[side].rounds.map((s) => s.ttftP99))),
        addedTtftP50Ms: added(t, side, (s) => s.ttftP50),
        addedTtftP99Ms: added(t, side, (s) => s.ttftP99),
        lastByteP50Ms: ms(median(t[side].rounds.map((s) => s.lastP50))),
        lastByteP99Ms: ms(median(t[side].rounds.map((s) => s.lastP99))),
        replayOverOriginal:
          side === 'replay'
            ? +median(t.replay.rounds.map((s, r) => s.lastP50 / t['new key'].rounds[r].lastP50)).toFixed(2)
            : undefined,
        redisRoundTripsPerRequest: roundTrips(t[side]),
      }));
    const throughput: GatewayThroughputRow[] = (['direct', 'new key'] as const).map((side) => ({
      side: `non-stream, ${side}`,
      requests: 1000 * ROUNDS,
      concurrency: 16,
      perSecond: Math.round(median(c16[side].map((x) => x.perSecond))),
      p50Ms: ms(median(c16[side].map((x) => x.p50))),
    }));

    const memory: GatewayMemoryRow[] = [];
    for (const body of [bodies.large, bodies.larger]) {
      const stored = newKey();
      check(await call(api, body, stored), 'new key', body);
      memory.push(await memoryPhase('replay of a stored stream', expectedBytes(body), () => slowReaders(stored, body)));
    }
    memory.push(
      await memoryPhase('attached to a running stream', expectedBytes(bodies.largeSlow), async () => {
        const running = newKey();
        const calls = provider.calls;
        const original = call(api, bodies.largeSlow, running);
        while (provider.calls === calls) await new Promise((r) => setTimeout(r, 1));
        const attached = await slowReaders(running, bodies.largeSlow);
        check(await original, 'new key', bodies.largeSlow);
        return attached;
      }),
    );

    return {
      calls,
      streams: [...streamRows('stream', stream), ...streamRows(`stream paced ${PACE_MS} ms`, paced)],
      throughput,
      memory,
    };
  } finally {
    uncount();
    await redis.flushdb();
    agent.destroy();
    await app.close();
    await provider.close();
  }
}
