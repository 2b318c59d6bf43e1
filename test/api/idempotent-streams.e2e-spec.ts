import { Body, Controller, Injectable, Module, Post, UseGuards } from '@nestjs/common';
import { IdempotencyStore, Idempotent, RedisIdempotencyStore, StreamedAnswer } from '@app/idempotency';
import { REDIS_CLIENT } from '@app/redis';
import { IsInt, IsOptional, Max, Min } from 'class-validator';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { ApiKeyGuard } from '../../apps/api/src/auth/api-key.guard';
import { type ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { recordedFrames } from '../support/frame-log';
import { eventually, freshRedis } from '../support/infra';
import { metricValue } from '../support/metrics';

/** Counts runs and lets a test hold a stream at a frame until it says go. */
@Injectable()
class Frames {
  runs = 0;
  private gate: Promise<void> | undefined;
  private open: (() => void) | undefined;

  hold(): void {
    this.gate = new Promise((r) => (this.open = r));
  }
  go(): void {
    this.open?.();
    this.gate = undefined;
  }
  async *produce(count: number, breakAt: number | undefined, holdAt: number | undefined): AsyncGenerator<string> {
    for (let i = 0; i < count; i++) {
      if (i === breakAt) throw new Error('the source broke');
      if (i === holdAt && this.gate) await this.gate;
      yield `{"n":${i},"run":${this.runs}}\n`;
    }
  }
}

class StreamDto {
  @IsInt() @Min(1) @Max(10_000) count!: number;
  @IsOptional() @IsInt() @Min(0) breakAt?: number;
  @IsOptional() @IsInt() @Min(0) holdAt?: number;
}

/** Any route can stream: NDJSON here, with the library's defaults (no error format of its own). */
@Controller('test/streams')
@UseGuards(ApiKeyGuard)
class StreamsController {
  constructor(private readonly frames: Frames) {}

  @Post()
  @Idempotent({ attach: { waitMs: 2000 }, maxStoredBodyBytes: 2000 })
  stream(@Body() body: StreamDto): StreamedAnswer {
    this.frames.runs++;
    return new StreamedAnswer(
      200,
      { 'content-type': 'application/x-ndjson' },
      this.frames.produce(body.count, body.breakAt, body.holdAt),
    );
  }

  /** Frames of bytes (any bytes: a NUL, bytes that are not UTF-8) beside frames of text. */
  @Post('bytes')
  @Idempotent()
  bytes(): StreamedAnswer {
    this.frames.runs++;
    return new StreamedAnswer(
      200,
      { 'content-type': 'application/octet-stream' },
      (async function* () {
        yield* BINARY_FRAMES;
      })(),
    );
  }
}

/** What the bytes route streams: bytes as they are, text as its UTF-8. */
const BINARY_FRAMES: readonly (Uint8Array | string)[] = [
  Buffer.from([0xff, 0xfe, 0x00, 0x01]),
  'naïve ☃\n',
  new Uint8Array([0xc3, 0x00, 0x80]),
];

@Module({ controllers: [StreamsController], providers: [Frames] })
class StreamsModule {}

const lines = (count: number, run: number) =>
  Array.from({ length: count }, (_, n) => `{"n":${n},"run":${run}}\n`).join('');

describe('@Idempotent() on a route that returns a StreamedAnswer', () => {
  let api: ApiHarness;
  let url: string;
  let frames: Frames;
  let redis: Redis;
  const key = () => `st-${randomUUID()}`;
  const post = (body: object, k: string, base = url) =>
    fetch(`${base}/test/streams`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': k },
      body: JSON.stringify(body),
    });
  const record = (k: string) => `idem:${TENANT_A.tenant}:POST:/test/streams:${k}`;

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi({ imports: [StreamsModule] });
    await api.app.listen(0, '127.0.0.1');
    url = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    frames = api.app.get(Frames);
  });
  afterAll(async () => {
    frames.go();
    await api.close();
    redis.disconnect();
  });

  it('stores the frames and replays them in order, running the handler once', async () => {
    const k = key();
    const runs = frames.runs;
    const first = await post({ count: 5 }, k);
    expect(first.headers.get('content-type')).toBe('application/x-ndjson');
    const text = await first.text();
    expect(text).toBe(lines(5, runs + 1));
    const again = await post({ count: 5 }, k);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.headers.get('content-type')).toBe('application/x-ndjson');
    expect(await again.text()).toBe(text);
    expect(frames.runs).toBe(runs + 1);
  });

  it('stores frames of bytes exactly as they were sent, and text frames as their UTF-8', async () => {
    const k = key();
    const runs = frames.runs;
    const expected = Buffer.concat(
      BINARY_FRAMES.map((f) => (typeof f === 'string' ? Buffer.from(f, 'utf8') : Buffer.from(f))),
    );
    const bytes = (base = url) =>
      fetch(`${base}/test/streams/bytes`, {
        method: 'POST',
        headers: { authorization: bearer(TENANT_A), 'idempotency-key': k },
      });
    const first = await bytes();
    expect(Buffer.from(await first.arrayBuffer()).equals(expected)).toBe(true);
    const again = await bytes();
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(Buffer.from(await again.arrayBuffer()).equals(expected)).toBe(true);
    expect(frames.runs).toBe(runs + 1);
  });

  it('attaches a duplicate to the running stream', async () => {
    const k = key();
    frames.hold();
    const runs = frames.runs;
    const first = post({ count: 6, holdAt: 3 }, k).then((r) => r.text());
    await eventually(() => (frames.runs === runs + 1 ? true : undefined));
    // Frames 0-2 came before the hold: once they and the head are in the record, the duplicate attaches mid-stream.
    const before = lines(3, runs + 1);
    await eventually(
      async () => ((await recordedFrames(redis, record(k))) === before ? true : undefined),
      5000,
      'frames 0-2 recorded',
    );
    // Its head came while the first is held: it is attached to the running stream, not a replay of a finished one.
    const duplicate = await post({ count: 6, holdAt: 3 }, k);
    frames.go();
    const a = await first;
    expect(a).toBe(lines(6, runs + 1));
    expect({ replayed: duplicate.headers.get('idempotent-replayed'), text: await duplicate.text() }).toEqual({
      replayed: 'true',
      text: a,
    });
    expect(frames.runs).toBe(runs + 1);
  });

  it('writes the frames that come with the end in the completion itself: one write, not an append and then it', async () => {
    const log = api.app.get<IdempotencyStore>(IdempotencyStore).frames!;
    const k = key();
    const appended: string[][] = [];
    const completedWith: string[][] = [];
    const text = (frames: readonly (Uint8Array | string)[] | undefined) =>
      (frames ?? []).map((f) => Buffer.from(f).toString('utf8'));
    const { append, completeWith } = log;
    if (!completeWith) throw new Error('the api store completes with frames');
    log.append = (...args) => {
      if (args[0].endsWith(k)) appended.push(text(args[2]));
      return append.apply(log, args);
    };
    log.completeWith = (...args) => {
      if (args[0].endsWith(k)) completedWith.push(text(args[4]));
      return completeWith.apply(log, args);
    };
    try {
      frames.hold();
      const runs = frames.runs;
      const first = post({ count: 6, holdAt: 3 }, k).then((r) => r.text());
      // Frames 0-2 come, then the handler holds: they are appended, for whoever attaches meanwhile.
      await eventually(() => (appended.flat().length === 3 ? true : undefined));
      // Frames 3-5 and the end come in one turn: they go with the completion.
      frames.go();
      const all = lines(6, runs + 1).split(/(?<=\n)/);
      expect(await first).toBe(all.join(''));
      expect({ appended: appended.flat(), completedWith }).toEqual({
        appended: all.slice(0, 3),
        completedWith: [all.slice(3)],
      });
      const again = await post({ count: 6, holdAt: 3 }, k);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(await again.text()).toBe(all.join(''));
      expect(frames.runs).toBe(runs + 1);
    } finally {
      log.append = append;
      log.completeWith = completeWith;
    }
  });

  it('appends what came before a break for a duplicate attached to the stream, before the key is freed', async () => {
    const k = key();
    frames.hold();
    const runs = frames.runs;
    // Frames 0-2, then held; on go, frame 3 and the break come in one turn.
    const first = post({ count: 6, holdAt: 3, breakAt: 4 }, k);
    const entries = async () => {
      const token = await redis.hget(record(k), 'token');
      return token === null ? 0 : redis.xlen(`{${record(k)}}:f:${token}`);
    };
    // The head and frames 0-2 are in the log: a duplicate now attaches to the running stream.
    await eventually(async () => ((await entries()) >= 4 ? true : undefined));
    const attached = await post({ count: 6, holdAt: 3, breakAt: 4 }, k);
    expect(attached.headers.get('idempotent-replayed')).toBe('true');
    frames.go();
    await expect((await first).text()).rejects.toThrow();
    // Frame 3 was still to be appended when the stream broke: it reaches the attached caller all the same.
    expect(await attached.text()).toBe(lines(4, runs + 1));
    expect(frames.runs).toBe(runs + 1);
    await expect(redis.exists(record(k))).resolves.toBe(0);
  });

  it('cuts the stream of a broken answer (no error format of its own), stores nothing and frees the key', async () => {
    const k = key();
    const released = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'released' });
    const broken = await post({ count: 5, breakAt: 2 }, k);
    await expect(broken.text()).rejects.toThrow();
    await expect(redis.exists(record(k))).resolves.toBe(0);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'released' })).toBe(released + 1);
    const runs = frames.runs;
    expect(await (await post({ count: 5 }, k)).text()).toBe(lines(5, runs + 1));
  });

  it('relays an answer over maxStoredBodyBytes whole, and does not store it', async () => {
    const k = key();
    const notStored = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'not_stored' });
    const runs = frames.runs;
    // 200 lines of about 20 bytes: over the route's 2,000.
    expect(await (await post({ count: 200 }, k)).text()).toBe(lines(200, runs + 1));
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'not_stored' })).toBe(notStored + 1);
    await expect(redis.exists(record(k))).resolves.toBe(0);
    const again = await post({ count: 200 }, k);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(await again.text()).toBe(lines(200, runs + 2));
  });

  describe('on a store that keeps no frames', () => {
    let plain: ApiHarness;
    let plainUrl: string;
    beforeAll(async () => {
      plain = await startApi({
        imports: [StreamsModule],
        override: (b) =>
          b.overrideProvider(IdempotencyStore).useFactory({
            inject: [REDIS_CLIENT],
            // The whole-body operations only, as a store without a frame log has them.
            factory: (client: Redis): IdempotencyStore => {
              const real = new RedisIdempotencyStore(client);
              return {
                claim: (...a) => real.claim(...a),
                complete: (...a) => real.complete(...a),
                release: (...a) => real.release(...a),
                renew: (...a) => real.renew(...a),
              };
            },
          }),
      });
      await plain.app.listen(0, '127.0.0.1');
      plainUrl = `http://127.0.0.1:${(plain.server.address() as AddressInfo).port}`;
    });
    afterAll(() => plain.close());

    it('relays a streamed answer without storing it, and answers a duplicate 409 instead of attaching it', async () => {
      const k = key();
      const app = plain.app.get(Frames);
      app.hold();
      const first = post({ count: 4, holdAt: 2 }, k, plainUrl).then((r) => r.text());
      await eventually(() => (app.runs > 0 ? true : undefined));
      const duplicate = await post({ count: 4, holdAt: 2 }, k, plainUrl);
      expect(duplicate.status).toBe(409);
      app.go();
      expect(await first).toBe(lines(4, 1));
      await expect(redis.exists(record(k))).resolves.toBe(0);
    });
  });
});
