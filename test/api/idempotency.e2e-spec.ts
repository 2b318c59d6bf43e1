import {
  Body,
  Controller,
  HttpCode,
  Injectable,
  Module,
  NotFoundException,
  Param,
  Post,
  Res,
  ServiceUnavailableException,
  UseGuards,
} from '@nestjs/common';
import {
  fingerprintBody,
  IDEMPOTENCY_OUTCOMES,
  IdempotencyProblemTypes,
  IdempotencyStore,
  Idempotent,
  RedisIdempotencyStore,
} from '@app/idempotency';
import { JOBS_STREAM } from '@app/summary-queue';
import { PROBLEM_CONTENT_TYPE, ProblemException } from '@app/problem';
import { REDIS_CLIENT } from '@app/redis';
import { IsInt, Max, Min } from 'class-validator';
import type { Response } from 'express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { ApiKeyGuard } from '../../apps/api/src/auth/api-key.guard';
import { ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { eventually, freePort, freshRedis, startRedisServer } from '../support/infra';
import { metricSample, metricValue } from '../support/metrics';

/** Counts handler runs per route and lets a test hold a run until it says go. */
@Injectable()
class Probe {
  readonly runs = new Map<string, number>();
  private readonly gates: (() => void)[] = [];

  run(route: string): number {
    const n = (this.runs.get(route) ?? 0) + 1;
    this.runs.set(route, n);
    return n;
  }
  count(route: string): number {
    return this.runs.get(route) ?? 0;
  }
  hold(): Promise<void> {
    return new Promise((resolve) => this.gates.push(resolve));
  }
  releaseAll(): void {
    this.gates.splice(0).forEach((open) => open());
  }
  reset(): void {
    this.runs.clear();
    this.releaseAll();
  }
}

class MsDto {
  @IsInt()
  @Min(0)
  @Max(5000)
  ms!: number;
}

/**
 * performance.now() as the interceptor reads it to time a handler's run, moved on by the test: a run held while the
 * clock is advanced takes that long, without the time passing. Only ever forward; restore() ends it.
 */
function advancingClock(): { advance(ms: number): void; restore(): void } {
  let offset = 0;
  const real = performance.now.bind(performance);
  const spy = jest.spyOn(performance, 'now').mockImplementation(() => real() + offset);
  return {
    advance: (ms) => void (offset += ms),
    restore: () => spy.mockRestore(),
  };
}

@Controller('test/ops')
@UseGuards(ApiKeyGuard)
class OpsController {
  constructor(private readonly probe: Probe) {}

  @Post('throws')
  @Idempotent()
  throws(): never {
    this.probe.run('throws');
    throw new Error('the handler failed');
  }

  @Post('unavailable')
  @Idempotent()
  unavailable(): never {
    this.probe.run('unavailable');
    throw new ServiceUnavailableException('downstream is down');
  }

  @Post('answers-503')
  @Idempotent()
  answers503(@Res({ passthrough: true }) res: Response): { ok: false } {
    this.probe.run('answers-503');
    res.status(503);
    return { ok: false };
  }

  @Post('business-404')
  @Idempotent()
  business404(): never {
    this.probe.run('business-404');
    throw new NotFoundException('No such order.');
  }

  @Post('created')
  @Idempotent()
  @HttpCode(201)
  created(@Res({ passthrough: true }) res: Response): { id: number } {
    const run = this.probe.run('created');
    res.location(`/things/${run}`);
    res.setHeader('Set-Cookie', 'session=secret');
    res.setHeader('X-Debug', 'not replayed');
    return { id: run };
  }

  @Post('validated')
  @Idempotent()
  validated(@Body() body: MsDto): { run: number; ms: number } {
    return { run: this.probe.run('validated'), ms: body.ms };
  }

  /** The module's lock TTL (IDEMPOTENCY_LOCK_TTL_S), renewed while it runs; each run holds until the test says go. */
  @Post('takes')
  @Idempotent()
  async takes(): Promise<{ run: number }> {
    const run = this.probe.run('takes');
    await this.probe.hold();
    return { run };
  }

  /** Its first run holds until the test lets it go, under a lock of 600 ms that only renewals keep. */
  @Post('renewed')
  @Idempotent({ lockTtlMs: 600 })
  async renewed(): Promise<{ run: number }> {
    const run = this.probe.run('renewed');
    if (run === 1) await this.probe.hold();
    return { run };
  }

  @Post('held')
  @Idempotent({ lockTtlMs: 400 })
  async held(): Promise<{ run: number }> {
    const run = this.probe.run('held');
    if (run === 1) await this.probe.hold();
    return { run };
  }

  @Post('big')
  @Idempotent({ maxStoredBodyBytes: 1000 })
  big(): { run: number; data: string } {
    return { run: this.probe.run('big'), data: 'x'.repeat(5000) };
  }

  @Post('undecorated')
  undecorated(): { run: number } {
    return { run: this.probe.run('undecorated') };
  }

  @Post('forbidden-with-cookie')
  @Idempotent()
  forbiddenWithCookie(): never {
    this.probe.run('forbidden-with-cookie');
    throw new ProblemException({
      type: 'urn:test:forbidden',
      title: 'Not for you',
      status: 403,
      headers: { 'Set-Cookie': 'session=secret', 'WWW-Authenticate': 'Bearer', 'Content-Language': 'en' },
    });
  }

  @Post('unserialisable/:kind')
  @Idempotent()
  unserialisable(@Param('kind') kind: string): object {
    this.probe.run(`unserialisable-${kind}`);
    if (kind === 'bigint') return { n: 10n };
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    return cyclic;
  }

  @Post('not-now/:status')
  @Idempotent()
  notNow(@Param('status') status: string): never {
    this.probe.run(`not-now-${status}`);
    throw new ProblemException({
      type: 'urn:test:not-now',
      title: 'Not now',
      status: Number(status),
      headers: { 'Retry-After': '1' },
    });
  }

  @Post('answers-429')
  @Idempotent()
  answers429(@Res({ passthrough: true }) res: Response): { retry: true } {
    this.probe.run('answers-429');
    res.status(429).setHeader('Retry-After', '1');
    return { retry: true };
  }

  @Post('sends-itself')
  @Idempotent()
  sendsItself(@Res({ passthrough: true }) res: Response): void {
    // Passthrough, yet it sends the answer itself: the interceptor cannot know what went out.
    res.status(201).json({ run: this.probe.run('sends-itself') });
  }

  @Post('orders/:id/refunds')
  @Idempotent()
  refund(@Param('id') id: string): { id: string; run: number } {
    return { id, run: this.probe.run(`refund-${id}`) };
  }
}

/** A second controller: the decorator on the class, with other options, overridden per method. */
@Controller('test/optional')
@UseGuards(ApiKeyGuard)
@Idempotent({ required: false, resultTtlMs: 1000 })
class OptionalKeyController {
  constructor(private readonly probe: Probe) {}

  @Post()
  create(): { run: number } {
    return { run: this.probe.run('optional') };
  }

  @Post('strict')
  @Idempotent({ required: true })
  strict(): { run: number } {
    return { run: this.probe.run('strict') };
  }
}

@Module({ controllers: [OpsController, OptionalKeyController], providers: [Probe] })
class TestFeatureModule {}

const newKey = () => `key-${randomUUID()}`;

describe('IdempotencyInterceptor on any controller', () => {
  let api: ApiHarness;
  let redis: Redis;
  let probe: Probe;

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi({ imports: [TestFeatureModule] });
    probe = api.app.get(Probe);
  });
  afterAll(async () => {
    probe.releaseAll();
    await api.close();
    redis.disconnect();
  });
  beforeEach(async () => {
    probe.reset();
    await redis.flushdb();
  });

  const post = (path: string, key?: string, body: object = {}) => {
    const req = request(api.server).post(path).set('Authorization', bearer(TENANT_A));
    if (key) req.set('Idempotency-Key', key);
    return req.send(body);
  };
  const recordKey = (path: string, key: string) => `idem:${TENANT_A.tenant}:POST:${path}:${key}`;
  const record = (path: string, key: string) => redis.hgetall(recordKey(path, key));

  it('a handler that throws: 500, the key is released, and the retry runs', async () => {
    const key = newKey();
    const first = await post('/test/ops/throws', key).expect(500);
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(first.body).not.toHaveProperty('stack');
    expect(await record('/test/ops/throws', key)).toEqual({});
    await post('/test/ops/throws', key).expect(500);
    expect(probe.count('throws')).toBe(2);
  });

  it('a handler that throws a 5xx HttpException: the key is released and the retry runs', async () => {
    const key = newKey();
    await post('/test/ops/unavailable', key).expect(503);
    await post('/test/ops/unavailable', key).expect(503);
    expect(probe.count('unavailable')).toBe(2);
    expect(await record('/test/ops/unavailable', key)).toEqual({});
  });

  it('a handler that answers 5xx itself: the key is released and the retry runs', async () => {
    const key = newKey();
    await post('/test/ops/answers-503', key).expect(503);
    await post('/test/ops/answers-503', key).expect(503);
    expect(probe.count('answers-503')).toBe(2);
  });

  it('a business 4xx from the handler is stored and replayed, without running it again', async () => {
    const key = newKey();
    const first = await post('/test/ops/business-404', key).expect(404);
    const second = await post('/test/ops/business-404', key).expect(404);
    expect(probe.count('business-404')).toBe(1);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(second.body).toEqual(first.body);
    expect(second.body.detail).toBe('No such order.');
  });

  it('a stored business 4xx keeps only allowlisted headers: the replay has no Set-Cookie or WWW-Authenticate', async () => {
    const key = newKey();
    const first = await post('/test/ops/forbidden-with-cookie', key).expect(403);
    expect(first.headers['set-cookie']).toEqual(['session=secret']);
    const replay = await post('/test/ops/forbidden-with-cookie', key).expect(403);
    expect(probe.count('forbidden-with-cookie')).toBe(1);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(first.body);
    expect(replay.headers['set-cookie']).toBeUndefined();
    expect(replay.headers['www-authenticate']).toBeUndefined();
    expect(replay.headers['content-language']).toBe('en');
    expect(JSON.parse((await record('/test/ops/forbidden-with-cookie', key)).headers)).toEqual({
      'content-language': 'en',
      'content-type': PROBLEM_CONTENT_TYPE,
    });
  });

  it('a replay keeps only allowlisted headers from the store too: a record written elsewhere cannot replay Set-Cookie', async () => {
    const key = newKey();
    const store: IdempotencyStore = new RedisIdempotencyStore(redis);
    const operation = `${TENANT_A.tenant}:POST:/test/ops/created:${key}`;
    // As another version of the api (or a person with redis-cli) might have stored it.
    await store.claim(operation, 'elsewhere', fingerprintBody({}), 10_000);
    await store.complete(
      operation,
      'elsewhere',
      fingerprintBody({}),
      {
        status: 201,
        headers: {
          'set-cookie': 'session=stolen',
          'www-authenticate': 'Bearer',
          'x-debug': 'leak',
          location: '/things/7',
          'content-type': 'application/json; charset=utf-8',
        },
        body: Buffer.from('{"id":7}'),
      },
      60_000,
    );
    const replay = await post('/test/ops/created', key).expect(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ id: 7 });
    expect(replay.headers.location).toBe('/things/7');
    expect(replay.headers['content-type']).toBe('application/json; charset=utf-8');
    expect(replay.headers['set-cookie']).toBeUndefined();
    expect(replay.headers['www-authenticate']).toBeUndefined();
    expect(replay.headers['x-debug']).toBeUndefined();
    expect(probe.count('created')).toBe(0);
  });

  it.each(['bigint', 'cyclic'])(
    'an answer that cannot be serialised (%s): 500, the key is released and the retry runs',
    async (kind) => {
      const key = newKey();
      const path = `/test/ops/unserialisable/${kind}`;
      const first = await post(path, key).expect(500);
      expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(await record(path, key)).toEqual({});
      // Not a 409 for the lock TTL: the handler runs again.
      await post(path, key).expect(500);
      expect(probe.count(`unserialisable-${kind}`)).toBe(2);
    },
  );

  it.each([408, 409, 425, 429])(
    'a handler that throws a transient %i: not stored, the key is released and the retry runs',
    async (status) => {
      const key = newKey();
      const path = `/test/ops/not-now/${status}`;
      const first = await post(path, key).expect(status);
      expect(first.headers['retry-after']).toBe('1');
      expect(await record(path, key)).toEqual({});
      const retry = await post(path, key).expect(status);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(probe.count(`not-now-${status}`)).toBe(2);
    },
  );

  it('a handler that answers 429 itself: not stored, the retry runs', async () => {
    const key = newKey();
    await post('/test/ops/answers-429', key).expect(429);
    expect(await record('/test/ops/answers-429', key)).toEqual({});
    await post('/test/ops/answers-429', key).expect(429);
    expect(probe.count('answers-429')).toBe(2);
  });

  it('a handler that sent its answer itself: nothing is stored, the retry runs', async () => {
    const key = newKey();
    const first = await post('/test/ops/sends-itself', key).expect(201);
    expect(first.body).toEqual({ run: 1 });
    expect(await record('/test/ops/sends-itself', key)).toEqual({});
    const second = await post('/test/ops/sends-itself', key).expect(201);
    expect(second.body).toEqual({ run: 2 });
    expect(probe.count('sends-itself')).toBe(2);
  });

  it('the record is named by the route with its parameters, not by the path as typed', async () => {
    const key = newKey();
    await post('/test/ops/orders/42/refunds', key).expect(201);
    // The same route and parameters, typed otherwise: a replay, not a second run.
    for (const path of [
      '/TEST/OPS/ORDERS/42/REFUNDS',
      '/test/ops/orders/42/refunds/',
      '/test/ops/orders/%34%32/refunds',
    ]) {
      const again = await post(path, key).expect(201);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toEqual({ id: '42', run: 1 });
    }
    expect(probe.count('refund-42')).toBe(1);
    // Other parameters are other operations, even under one key; values keep their case,
    // and an encoded slash stays inside its segment.
    await post('/test/ops/orders/ab/refunds', key).expect(201);
    const upper = await post('/test/ops/orders/AB/refunds', key).expect(201);
    expect(upper.headers['idempotent-replayed']).toBeUndefined();
    await post('/test/ops/orders/a%2Fb/refunds', key).expect(201);
    expect([probe.count('refund-ab'), probe.count('refund-AB'), probe.count('refund-a/b')]).toEqual([1, 1, 1]);
    expect((await redis.keys('idem:*')).sort()).toEqual(
      [
        '/test/ops/orders/42/refunds',
        '/test/ops/orders/AB/refunds',
        '/test/ops/orders/a%2Fb/refunds',
        '/test/ops/orders/ab/refunds',
      ]
        .map((path) => `idem:${TENANT_A.tenant}:POST:${path}:${key}`)
        .sort(),
    );
  });

  it('replays status and allowlisted headers, never Set-Cookie', async () => {
    const key = newKey();
    const first = await post('/test/ops/created', key).expect(201);
    expect(first.headers['set-cookie']).toBeDefined();
    const replay = await post('/test/ops/created', key).expect(201);
    expect(probe.count('created')).toBe(1);
    expect(replay.body).toEqual({ id: 1 });
    expect(replay.headers.location).toBe('/things/1');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['set-cookie']).toBeUndefined();
    expect(replay.headers['x-debug']).toBeUndefined();
    expect(JSON.parse((await record('/test/ops/created', key)).headers)).toEqual({
      location: '/things/1',
      'content-type': 'application/json; charset=utf-8',
    });
  });

  it('renews the lock of a handler that runs over twice its lock TTL: duplicates meanwhile get 409', async () => {
    const key = newKey();
    // Lock TTL 600 ms, renewed every 200 ms; the handler runs until the test lets it go, after the duplicates.
    // Each duplicate below comes once the lock, as it stood before, would have expired unrenewed: Redis itself expires
    // a twin key given the lock's remaining time. Unrenewed, the lock would be gone by then and the duplicate would run
    // the handler again. Renewed, only a stall of some 400 ms between two renewals could let one in.
    const slow = post('/test/ops/renewed', key).then((r) => r);
    await eventually(() => (probe.count('renewed') === 1 ? true : undefined));
    const lock = recordKey('/test/ops/renewed', key);
    const twin = `twin:${lock}`;
    const during: number[] = [];
    for (let i = 0; i < 2; i++) {
      const left = await redis.pttl(lock);
      expect(left).toBeGreaterThan(0);
      await redis.set(twin, '1', 'PX', left);
      await eventually(
        async () => ((await redis.exists(twin)) === 0 ? true : undefined),
        5000,
        'the lock as it stood to expire, had it not been renewed',
      );
      const dup = await post('/test/ops/renewed', key);
      during.push(dup.status);
      expect(dup.body.type).toBe(IdempotencyProblemTypes.inProgress);
    }
    probe.releaseAll();
    expect(during).toEqual([409, 409]);
    const first = await slow;
    expect(first.status).toBe(201);
    expect(first.body).toEqual({ run: 1 });
    expect(probe.count('renewed')).toBe(1);
    const replay = await post('/test/ops/renewed', key).expect(201);
    expect(replay.body).toEqual({ run: 1 });
  });

  it("a 409's Retry-After is when the running request is likely done (the route's recent runs), and a retry then gets the answer", async () => {
    const clock = advancingClock();
    try {
      // One run teaches the route how long it takes: 2.5 s on the clock the interceptor times runs with, moved on
      // while the run is held.
      const teacher = post('/test/ops/takes', newKey()).then((r) => r);
      await eventually(() => (probe.count('takes') === 1 ? true : undefined));
      clock.advance(2500);
      probe.releaseAll();
      expect((await teacher).status).toBe(201);
      const key = newKey();
      const first = post('/test/ops/takes', key).then((r) => r);
      await eventually(() => (probe.count('takes') === 2 ? true : undefined));
      const dup = await post('/test/ops/takes', key).expect(409);
      // 2.5 s less the few ms it has run (by Redis's clock): 3 s, or 2 s on a slow machine;
      // not 1 s (nothing known) and not the lock TTL (10 s, when the key would free).
      const retryAfter = Number(dup.headers['retry-after']);
      expect([2, 3]).toContain(retryAfter);
      expect(dup.body.detail).toBe(`Retry after ${retryAfter} s to get its answer.`);
      // The running request finishes; the retry then gets its answer.
      probe.releaseAll();
      expect((await first).body).toEqual({ run: 2 });
      const retry = await post('/test/ops/takes', key).expect(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toEqual({ run: 2 });
      expect(probe.count('takes')).toBe(2);
    } finally {
      clock.restore();
    }
  });

  it('lock lost: a second request takes over, the first one cannot overwrite its record, and it is counted', async () => {
    const key = newKey();
    const lostBefore = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'lock_lost' });
    const first = post('/test/ops/held', key).then((r) => r);
    await eventually(() => (probe.count('held') === 1 ? true : undefined));
    // The marker expires as it would had renewal stopped.
    await redis.del(`idem:${TENANT_A.tenant}:POST:/test/ops/held:${key}`);
    const second = await post('/test/ops/held', key).expect(201);
    expect(second.body).toEqual({ run: 2 });
    probe.releaseAll();
    expect((await first).body).toEqual({ run: 1 });
    const replay = await post('/test/ops/held', key).expect(201);
    expect(replay.body).toEqual({ run: 2 });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(probe.count('held')).toBe(2);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'lock_lost' })).toBeGreaterThan(
      lostBefore,
    );
  });

  it('a pipe that rejects the body leaves nothing stored: the corrected retry runs', async () => {
    const key = newKey();
    const bad = await post('/test/ops/validated', key, { ms: 'soon' }).expect(400);
    expect(bad.body.errors[0].field).toBe('ms');
    expect(await record('/test/ops/validated', key)).toEqual({});
    expect(probe.count('validated')).toBe(0);
    await post('/test/ops/validated', key, { ms: 0 }).expect(201);
    expect(probe.count('validated')).toBe(1);
  });

  it('an answer over the size cap is sent but not stored; the key is released', async () => {
    const key = newKey();
    const before = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'not_stored' });
    const res = await post('/test/ops/big', key).expect(201);
    expect(res.body.data).toHaveLength(5000);
    expect(await record('/test/ops/big', key)).toEqual({});
    await post('/test/ops/big', key).expect(201);
    expect(probe.count('big')).toBe(2);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'not_stored' })).toBe(before + 2);
  });

  it('routes without @Idempotent() are untouched, key or not', async () => {
    const key = newKey();
    await post('/test/ops/undecorated', key).expect(201);
    await post('/test/ops/undecorated', key).expect(201);
    expect(probe.count('undecorated')).toBe(2);
    expect(await redis.keys('idem:*')).toEqual([]);
  });

  it('class-level options: the key is optional there, and a result TTL of 1 s', async () => {
    await post('/test/optional').expect(201);
    await post('/test/optional').expect(201);
    expect(probe.count('optional')).toBe(2);
    const key = newKey();
    await post('/test/optional', key).expect(201);
    const replay = await post('/test/optional', key).expect(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(probe.count('optional')).toBe(3);
    // Stored for the class's 1 s, not the module's default; once Redis has expired it, the key runs again.
    const stored = recordKey('/test/optional', key);
    const ttl = await redis.pttl(stored);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(1000);
    await eventually(
      async () => ((await redis.exists(stored)) === 0 ? true : undefined),
      5000,
      'the stored answer to expire',
    );
    await post('/test/optional', key).expect(201);
    expect(probe.count('optional')).toBe(4);
  });

  it('method options override class options: the key is required there', async () => {
    const res = await post('/test/optional/strict').expect(400);
    expect(res.body.type).toBe(IdempotencyProblemTypes.keyMissing);
    expect(probe.count('strict')).toBe(0);
  });

  it('documents the header and the idempotency answers of every @Idempotent() route in OpenAPI, by itself', async () => {
    const doc = (await request(api.server).get('/docs/openapi.json').expect(200)).body as {
      paths: Record<
        string,
        Record<
          string,
          { parameters?: { name: string; in: string; required?: boolean }[]; responses: Record<string, unknown> }
        >
      >;
    };
    const header = (path: string) =>
      doc.paths[path].post.parameters?.filter((p) => p.in === 'header' && p.name === 'Idempotency-Key') ?? [];
    for (const path of ['/v1/summaries', '/test/ops/created', '/test/optional', '/test/optional/strict']) {
      expect(Object.keys(doc.paths[path].post.responses)).toEqual(expect.arrayContaining(['409', '422']));
      expect(header(path)).toHaveLength(1);
    }
    expect(header('/v1/summaries')[0].required).toBe(true);
    expect(header('/test/optional')[0].required).toBe(false);
    expect(header('/test/optional/strict')[0].required).toBe(true);
    expect(header('/test/ops/undecorated')).toEqual([]);
    expect(Object.keys(doc.paths['/test/ops/undecorated'].post.responses)).not.toContain('409');
  });

  it('exposes every idempotency outcome from the start, at 0, so an alert sees the first one', async () => {
    const fresh = await startApi();
    try {
      for (const outcome of IDEMPOTENCY_OUTCOMES) {
        expect({ outcome, value: await metricSample(fresh.server, 'idempotency_requests_total', { outcome }) }).toEqual(
          { outcome, value: 0 },
        );
      }
    } finally {
      await fresh.close();
    }
  });

  it('counts replays in idempotency_requests_total', async () => {
    const key = newKey();
    const before = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'replayed' });
    const newBefore = await metricValue(api.server, 'idempotency_requests_total', { outcome: 'new' });
    await post('/test/ops/created', key).expect(201);
    await post('/test/ops/created', key).expect(201);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'replayed' })).toBe(before + 1);
    expect(await metricValue(api.server, 'idempotency_requests_total', { outcome: 'new' })).toBe(newBefore + 1);
  });
});

describe('crash between XADD and finalise', () => {
  it('the retry after the marker expires enqueues a second message carrying the same job id', async () => {
    const redis = await freshRedis();
    // Pod A enqueues, then dies before it stores the answer: no finalise, no
    // renewal. Its claim and XADD are real.
    const crashed = await startApi({
      env: { IDEMPOTENCY_LOCK_TTL_S: '1' },
      override: (b) =>
        b.overrideProvider(IdempotencyStore).useFactory({
          inject: [REDIS_CLIENT],
          factory: (client: Redis) => {
            const real = new RedisIdempotencyStore(client);
            return {
              claim: real.claim.bind(real),
              release: real.release.bind(real),
              renew: async () => true,
              complete: () => new Promise<boolean>(() => undefined),
            } satisfies IdempotencyStore;
          },
        }),
    });
    const survivor = await startApi({ env: { IDEMPOTENCY_LOCK_TTL_S: '1' } });
    try {
      const key = newKey();
      const body = { text: 'Summarise me.', notify: 'a@example.com' };
      const lost = request(crashed.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .timeout(500)
        .send(body)
        .then(
          () => undefined,
          (err: Error) => err,
        );
      // Pod A has claimed the key and enqueued (its entry is in the stream): the retry comes at once, well within the
      // 1 s lock A's claim took, however slow the machine.
      await eventually(
        async () => ((await redis.xlen(JOBS_STREAM)) === 1 ? true : undefined),
        5000,
        'pod A to enqueue',
      );
      const early = await request(survivor.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .send(body);
      expect(early.status).toBe(409);
      // Pod A never answers.
      expect(await lost).toMatchObject({ message: expect.stringMatching(/Timeout/) });
      expect(await redis.xlen(JOBS_STREAM)).toBe(1);

      // The lock A took (1 s), never renewed, expires in Redis.
      const lock = `idem:${TENANT_A.tenant}:POST:/v1/summaries:${key}`;
      const left = await redis.pttl(lock);
      expect(left).toBeGreaterThan(0);
      expect(left).toBeLessThanOrEqual(1000);
      await eventually(
        async () => ((await redis.exists(lock)) === 0 ? true : undefined),
        5000,
        'the lock A took to expire',
      );
      const retry = await request(survivor.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', key)
        .send(body)
        .expect(202);
      const entries = await redis.xrange(JOBS_STREAM, '-', '+');
      expect(entries).toHaveLength(2);
      const jobIds = entries.map(([, fields]) => fields[fields.indexOf('job_id') + 1]);
      expect(jobIds).toEqual([retry.body.job_id, retry.body.job_id]);
    } finally {
      await crashed.close();
      await survivor.close();
      redis.disconnect();
    }
  });
});

describe('when the idempotency store cannot reach Redis', () => {
  it('answers 503 store-unavailable and runs nothing', async () => {
    const server = await startRedisServer(freePort(2));
    const api = await startApi({ env: { REDIS_URL: server.url }, imports: [TestFeatureModule] });
    const probe = api.app.get(Probe);
    try {
      await request(api.server)
        .post('/test/ops/created')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', newKey())
        .expect(201);
      await server.stop();
      const res = await request(api.server)
        .post('/test/ops/created')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', newKey())
        .expect(503);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body.type).toBe(IdempotencyProblemTypes.storeUnavailable);
      expect(res.headers['retry-after']).toBe('1');
      const summaries = await request(api.server)
        .post('/v1/summaries')
        .set('Authorization', bearer(TENANT_A))
        .set('Idempotency-Key', newKey())
        .send({ text: 'x', notify: 'a@example.com' })
        .expect(503);
      expect(summaries.body.type).toBe(IdempotencyProblemTypes.storeUnavailable);
      expect(probe.count('created')).toBe(1);
      const ready = await request(api.server).get('/health/ready').expect(503);
      expect(ready.body.failing).toEqual(['redis']);
    } finally {
      await api.close();
      await server.stop();
    }
  });
});
