import {
  Body,
  Controller,
  type DynamicModule,
  HttpCode,
  HttpStatus,
  Inject,
  Module,
  Post,
  Res,
  UseGuards,
} from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { FakePaymentsProvider, type PaymentsProvider } from '@app/payments';
import { REDIS_CLIENT } from '@app/redis';
import type { Response } from 'express';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { DataSource } from 'typeorm';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { ApiKeyGuard } from '../../apps/api/src/auth/api-key.guard';
import { Tenant } from '../../apps/api/src/auth/principal';
import { createApiApp } from '../../apps/api/src/create-api-app';
import { CreateRefundDto, type RefundDto } from '../../apps/api/src/refunds/refund.dto';
import { refundAnswerOf, refundLocation } from '../../apps/api/src/refunds/refunds.service';
import {
  countPostgresStatements,
  countRedisCommands,
  type Drive,
  drive,
  KEY,
  median,
  ms,
  orderOf,
  overRounds,
  type RoundsRow,
  type Sample,
  timed,
} from './support';

/*
 * POST /v1/refunds against the same work without idempotency, in one api,
 * PAYMENTS_URL unset (the built-in in-memory provider, which costs next to
 * nothing), so the figures are the route's own cost:
 * - new key: the real route, a fresh Idempotency-Key per request;
 * - plain: a bench-only route (below) that validates the same DTO behind the
 *   same guard, pays the same in-memory provider and inserts the same
 *   `refunds` row in a transaction, with no @Idempotent (no claim, no lookup
 *   of an earlier refund, no stored answer);
 * - replay: the real route, one key already answered, sent again and again.
 * Each round runs the three in turn, each taking each place in turn; every
 * figure is the median of the rounds', an "added" or a "/ plain" one the
 * median of the rounds' differences or quotients against plain.
 */

export type RefundSide = 'new key' | 'plain' | 'replay';
const SIDES: readonly RefundSide[] = ['new key', 'plain', 'replay'];

export interface RefundBenchRow extends RoundsRow {
  readonly side: RefundSide;
  readonly path: string;
  /** The spread of p50 over the rounds. */
  readonly p50MinMs: number;
  readonly p50MaxMs: number;
  /**
   * Medians over the rounds of this side's figure minus (latency) or over (both) plain's in the same round; undefined
   * for plain.
   */
  readonly addedP50Ms: number | undefined;
  readonly addedP99Ms: number | undefined;
  readonly p50OverPlain: number | undefined;
  readonly perSecondOverPlain: number | undefined;
}

const ROUNDS = 5;
const REQUESTS = 1500;
const CONCURRENCY = 16; // as the other api benches
const WARMUP = 200;
const PLAIN_PATH = 'bench/refunds-plain';
const BODY = JSON.stringify({ ticket_id: 'T-1042', order_id: 'ord_7781', amount: 1250, currency: 'EUR' });
/** A new refund (either route), or with `replayed` a replay: 201 both. */
const REFUND: Drive = { body: BODY, status: 201 };

const PLAIN_PAYMENTS = Symbol('bench:plain-payments');

/**
 * The refund without idempotency: what the route would do if every request
 * were a new refund. Same DTO (the api's global RequestValidationPipe), same
 * guard, same provider call, same INSERT in a transaction, same 201, body and
 * Location; the refund id is random, the key header is ignored.
 */
@Controller(PLAIN_PATH)
@UseGuards(ApiKeyGuard)
class PlainRefundsController {
  private readonly signal = new AbortController().signal;

  constructor(
    @Inject(PLAIN_PAYMENTS) private readonly provider: PaymentsProvider,
    private readonly dataSource: DataSource,
  ) {}

  @Post()
  @HttpCode(HttpStatus.CREATED)
  async create(
    @Body() body: CreateRefundDto,
    @Tenant() tenant: string,
    @Res({ passthrough: true }) res: Response,
  ): Promise<RefundDto> {
    const refundId = randomUUID();
    const result = await this.provider.payout(
      { reference: refundId, order_id: body.order_id, amount: body.amount, currency: body.currency },
      this.signal,
    );
    if (result.outcome !== 'paid') throw new Error(`the bench's provider refused a payout (${result.status})`);
    // The row alone, as a route without idempotency writes it (RefundRepository.record also clears the route's send
    // mark).
    const refund = {
      refundId,
      tenant,
      ticketId: body.ticket_id,
      orderId: body.order_id,
      amount: body.amount,
      currency: body.currency,
      payoutId: result.payout.payout_id,
    };
    const [row] = await this.dataSource.transaction((em) =>
      em.query<{ created_at: Date }[]>(
        'INSERT INTO refunds (refund_id, tenant, ticket_id, order_id, amount, currency, payout_id) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING created_at',
        [
          refund.refundId,
          refund.tenant,
          refund.ticketId,
          refund.orderId,
          refund.amount,
          refund.currency,
          refund.payoutId,
        ],
      ),
    );
    const stored = { ...refund, createdAt: row.created_at };
    res.location(refundLocation(refundId));
    return refundAnswerOf(stored);
  }
}

/**
 * The api as it runs (ApiModule), plus the plain route; PaymentsProvider is RefundsModule's own, so the plain route has
 * its own fake.
 */
@Module({})
class RefundsBenchModule {
  static forRoot(api: DynamicModule): DynamicModule {
    return {
      module: RefundsBenchModule,
      imports: [api],
      controllers: [PlainRefundsController],
      providers: [{ provide: PLAIN_PAYMENTS, useValue: new FakePaymentsProvider() }],
    };
  }
}

/**
 * Counts the api's round trips (countRedisCommands, countPostgresStatements) by side, only while a measured run is
 * `counting` (not in warm-ups, resets or checks).
 */
function countRoundTrips(app: NestExpressApplication) {
  const state = { counting: undefined as RefundSide | undefined, redis: tally(), postgres: tally() };
  countRedisCommands(app.get<Redis>(REDIS_CLIENT), () => {
    if (state.counting) state.redis[state.counting]++;
  });
  countPostgresStatements(app.get(DataSource), () => {
    if (state.counting) state.postgres[state.counting]++;
  });
  return state;
}

function tally(): Record<RefundSide, number> {
  return { 'new key': 0, plain: 0, replay: 0 };
}

export async function benchRefunds(redisUrl: string, databaseUrl: string): Promise<RefundBenchRow[]> {
  const config = loadApiConfig({
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    API_KEYS: `bench:${KEY}`,
  });
  const app = (await createApiApp(RefundsBenchModule.forRoot(ApiModule.forRoot(config)))) as NestExpressApplication;
  await app.listen(0, '127.0.0.1');
  const base = `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`;
  const urls: Record<RefundSide, string> = {
    'new key': `${base}/v1/refunds`,
    plain: `${base}/${PLAIN_PATH}`,
    replay: `${base}/v1/refunds`,
  };
  const ds = app.get(DataSource);
  const counts = countRoundTrips(app);
  const reset = () => ds.query('TRUNCATE refunds, idempotency_keys, idempotency_frames');
  const runId = randomUUID();
  let replayKey = '';
  const keyOf: Record<RefundSide, (i: number) => string> = {
    'new key': (i) => `refund-${runId}-${i}-${randomUUID()}`,
    plain: (i) => `plain-${runId}-${i}-${randomUUID()}`,
    replay: () => replayKey,
  };

  const samples: Record<RefundSide, Sample[]> = { 'new key': [], plain: [], replay: [] };
  const expected = (side: RefundSide): Drive => ({ ...REFUND, replayed: side === 'replay' });
  const measure = async (side: RefundSide): Promise<void> => {
    await drive(urls[side], WARMUP, CONCURRENCY, keyOf[side], expected(side));
    counts.counting = side;
    samples[side].push(
      await timed(REQUESTS, () => drive(urls[side], REQUESTS, CONCURRENCY, keyOf[side], expected(side))),
    );
    counts.counting = undefined;
  };

  try {
    await reset();
    await check(urls, ds);
    for (let r = 0; r < ROUNDS; r++) {
      // Every round from empty tables, its replay key answered once before any side runs.
      await reset();
      replayKey = `replay-${runId}-${r}`;
      await drive(urls.replay, 1, 1, () => replayKey, REFUND);
      for (const side of orderOf(SIDES, r)) await measure(side);
    }
  } finally {
    await reset().catch(() => undefined);
    await app.close();
  }

  const plain = samples.plain;
  return SIDES.map((side) => {
    const s = samples[side];
    const p50 = s.map((x) => x.p50Ms);
    const against = (pick: (x: Sample) => number, f: (a: number, b: number) => number, digits: number) =>
      side === 'plain' ? undefined : +median(s.map((x, r) => f(pick(x), pick(plain[r])))).toFixed(digits);
    return {
      side,
      path: `POST ${new URL(urls[side]).pathname}`,
      rounds: ROUNDS,
      requestsPerRound: REQUESTS,
      concurrency: CONCURRENCY,
      ...overRounds(s),
      p50MinMs: ms(Math.min(...p50)),
      p50MaxMs: ms(Math.max(...p50)),
      addedP50Ms: against(
        (x) => x.p50Ms,
        (a, b) => a - b,
        2,
      ),
      addedP99Ms: against(
        (x) => x.p99Ms,
        (a, b) => a - b,
        2,
      ),
      p50OverPlain: against(
        (x) => x.p50Ms,
        (a, b) => a / b,
        2,
      ),
      perSecondOverPlain: against(
        (x) => x.perSecond,
        (a, b) => a / b,
        2,
      ),
      redisRoundTripsPerRequest: +(counts.redis[side] / (ROUNDS * REQUESTS)).toFixed(2),
      postgresRoundTripsPerRequest: +(counts.postgres[side] / (ROUNDS * REQUESTS)).toFixed(2),
    };
  });
}

/**
 * Before measuring: both routes answer the same 201 (fields, Location), each new one a row in `refunds`, and a replay
 * is a replay.
 */
async function check(urls: Record<RefundSide, string>, ds: DataSource): Promise<void> {
  const post = async (url: string, key: string) => {
    const res = await fetch(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'idempotency-key': key },
      body: BODY,
    });
    return {
      status: res.status,
      body: (await res.json()) as Record<string, unknown>,
      location: res.headers.get('location'),
      replayed: res.headers.get('idempotent-replayed'),
    };
  };
  const key = `check-${randomUUID()}`;
  const real = await post(urls['new key'], key);
  const plain = await post(urls.plain, key);
  const again = await post(urls.replay, key);
  const shape = (a: { status: number; body: Record<string, unknown>; location: string | null }) =>
    JSON.stringify([
      a.status,
      Object.keys(a.body).sort(),
      a.location === `/v1/refunds/${String(a.body.refund_id)}`,
      a.body.status,
    ]);
  if (shape(real) !== shape(plain))
    throw new Error(`the plain route answers otherwise: ${shape(real)} against ${shape(plain)}`);
  if (real.status !== 201 || again.replayed !== 'true' || JSON.stringify(again.body) !== JSON.stringify(real.body)) {
    throw new Error(`POST /v1/refunds: ${real.status}, replay ${again.status} replayed=${again.replayed}`);
  }
  const [{ n }] = await ds.query<{ n: number }[]>('SELECT count(*)::int AS n FROM refunds WHERE refund_id = ANY($1)', [
    [real.body.refund_id, plain.body.refund_id],
  ]);
  if (n !== 2) throw new Error(`expected both refunds recorded, found ${n}`);
}
