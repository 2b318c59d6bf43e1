import { Body, Controller, HttpCode, Injectable, Module, Post, UseGuards } from '@nestjs/common';
import {
  IdempotencyContext,
  type IdempotencyRecovery,
  IdempotencyRecord,
  type IdempotencyRequestContext,
  Idempotent,
  IdempotencyOutcomeUnknownException,
  type PendingIdempotencyRecord,
  type RecoveredAnswer,
} from '@app/idempotency';
import { IsBoolean, IsInt, IsOptional, Min } from 'class-validator';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ApiKeyGuard } from '../../apps/api/src/auth/api-key.guard';
import { type ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';

class PayDto {
  @IsInt() @Min(1) amount!: number;
  /** The provider did not answer: the outcome is unknown. */
  @IsOptional() @IsBoolean() unknownOutcome?: boolean;
  /** Throws after the answer was stored in the transaction: the whole transaction rolls back. */
  @IsOptional() @IsBoolean() failAfterStore?: boolean;
}

let runs = 0;

/** The effect's table, in the same database as the records. */
const EFFECTS = 'test_tx_effects';

/** Looks up what a request that died did, in the effect's own table. */
@Injectable()
class PaymentRecovery implements IdempotencyRecovery {
  recoveries = 0;
  /** The provider cannot be asked right now: the outcome stays unknown. */
  unavailable = false;
  constructor(private readonly db: DataSource) {}

  /** Payments the provider made that no row records yet (a request died between the two), by operation. */
  readonly atProvider = new Map<string, { payment_id: string; amount: number }>();
  /** Fails the recovery's transaction after it stored the answer. */
  failAfterStore = false;

  async recover(
    ctx: IdempotencyRequestContext,
    _req: unknown,
    record: PendingIdempotencyRecord,
  ): Promise<RecoveredAnswer | undefined> {
    this.recoveries++;
    if (this.unavailable) throw new IdempotencyOutcomeUnknownException('The provider cannot be asked right now.');
    const rows = await this.db.query<
      {
        payment_id: string;
        amount: number;
      }[]
    >(`SELECT payment_id, amount FROM ${EFFECTS} WHERE operation = $1`, [ctx.operation]);
    if (rows[0])
      return { status: 201, body: { payment_id: rows[0].payment_id, amount: rows[0].amount, recovered: true } };
    const paid = this.atProvider.get(ctx.operation);
    if (!paid) return undefined;
    // Found outside: recorded now, its row and the stored answer in one transaction.
    const answer = { ...paid, recovered: true };
    await this.db.transaction(async (tx) => {
      await tx.query(`INSERT INTO ${EFFECTS} (operation, payment_id, amount) VALUES ($1, $2, $3)`, [
        ctx.operation,
        paid.payment_id,
        paid.amount,
      ]);
      await record.completeWithin(tx, {
        status: 201,
        body: answer,
        headers: { location: `/test/payments/${paid.payment_id}` },
      });
      if (this.failAfterStore) throw new Error('the recovery failed after storing its answer');
    });
    // Whatever is returned now, what was stored is what is sent.
    return { status: 200, body: { ignored: true } };
  }
}

@Controller('test/payments')
@UseGuards(ApiKeyGuard)
class PaymentsController {
  constructor(private readonly db: DataSource) {}

  /** The effect's row and the stored answer commit in one transaction, or neither does. */
  @Post()
  @HttpCode(201)
  @Idempotent({ store: 'postgres', recover: PaymentRecovery })
  async pay(
    @Body() body: PayDto,
    @IdempotencyContext() ctx: IdempotencyRequestContext,
    @IdempotencyRecord() record: PendingIdempotencyRecord,
  ): Promise<{ payment_id: string; amount: number }> {
    runs++;
    if (body.unknownOutcome) throw new IdempotencyOutcomeUnknownException('The provider did not answer in time.');
    const answer = { payment_id: randomUUID(), amount: body.amount };
    await this.db.transaction(async (tx) => {
      await tx.query(`INSERT INTO ${EFFECTS} (operation, payment_id, amount) VALUES ($1, $2, $3)`, [
        ctx.operation,
        answer.payment_id,
        body.amount,
      ]);
      await record.completeWithin(tx, { status: 201, body: answer });
      if (body.failAfterStore) throw new Error('the handler failed after storing its answer');
    });
    return answer;
  }
}

@Module({ controllers: [PaymentsController], providers: [PaymentRecovery] })
class PaymentsModule {}

describe('an @Idempotent() route that finalises its record in its own transaction, with a recovery hook', () => {
  let api: ApiHarness;
  let db: DataSource;
  const key = () => `tx-${randomUUID()}`;
  const operation = (k: string) => `${TENANT_A.tenant}:POST:/test/payments:${k}`;
  const pay = (k: string, body: object) =>
    request(api.server)
      .post('/test/payments')
      .set('authorization', bearer(TENANT_A))
      .set('idempotency-key', k)
      .send(body);
  const effects = async (k: string) =>
    Number((await db.query(`SELECT count(*) AS n FROM ${EFFECTS} WHERE operation = $1`, [operation(k)]))[0].n);
  const record = async (k: string) =>
    (await db.query(`SELECT state, status, body FROM idempotency_keys WHERE key = $1`, [operation(k)]))[0] as
      { state: string; status: number; body: string } | undefined;

  /** The record a request leaves that died holding `k`: running, its lock expired. */
  const diedHolding = (k: string) =>
    db.query(
      `INSERT INTO idempotency_keys (key, fingerprint, state, token, attempt, started_at, locked_until, expires_at)
       VALUES ($1, $2, 'running', 'dead', $3, now() - interval '1 minute', now() - interval '1 second', now() - interval '1 second')`,
      [operation(k), 'any', randomUUID()],
    );

  beforeAll(async () => {
    api = await startApi({ imports: [PaymentsModule] });
    db = api.app.get(DataSource);
    await db.query(
      `CREATE TABLE IF NOT EXISTS ${EFFECTS} (operation text PRIMARY KEY, payment_id uuid NOT NULL, amount integer NOT NULL)`,
    );
  });
  afterAll(async () => {
    await db.query(`DROP TABLE IF EXISTS ${EFFECTS}`);
    await api.close();
  });

  it('commits the effect and the stored answer together, and replays it', async () => {
    const k = key();
    const before = runs;
    const first = await pay(k, { amount: 500 }).expect(201);
    expect(await effects(k)).toBe(1);
    expect(await record(k)).toMatchObject({ state: 'completed', status: 201 });
    expect(JSON.parse((await record(k))!.body)).toEqual(first.body);
    const again = await pay(k, { amount: 500 }).expect(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toEqual(first.body);
    expect(runs).toBe(before + 1);
  });

  it('rolls both back when the handler fails after storing: no effect, no answer, and the retry runs', async () => {
    const k = key();
    await pay(k, { amount: 700, failAfterStore: true }).expect(500);
    expect(await effects(k)).toBe(0);
    expect(await record(k)).toBeUndefined();
    const retry = await pay(k, { amount: 700, failAfterStore: true }).expect(500);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    // Nothing was stored: the key is free, and the corrected request runs for real.
    await pay(k, { amount: 700 }).expect(201);
    expect(await effects(k)).toBe(1);
  });

  it('answers from the recovery hook when the earlier request died after its effect, without running the handler', async () => {
    const k = key();
    const paymentId = randomUUID();
    // A request that paid and died before its commit of the answer: the effect is there, its lock expired.
    await db.query(`INSERT INTO ${EFFECTS} (operation, payment_id, amount) VALUES ($1, $2, 900)`, [
      operation(k),
      paymentId,
    ]);
    await diedHolding(k);
    const recovery = api.app.get(PaymentRecovery);
    const recoveries = recovery.recoveries;
    const before = runs;
    const answer = await pay(k, { amount: 900 }).expect(201);
    expect(answer.body).toEqual({ payment_id: paymentId, amount: 900, recovered: true });
    expect(runs).toBe(before);
    expect(recovery.recoveries).toBe(recoveries + 1);
    expect(await effects(k)).toBe(1);
    expect(await record(k)).toMatchObject({ state: 'completed', status: 201 });
    const replay = await pay(k, { amount: 900 }).expect(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(answer.body);
  });

  it('lets a recovery record what it found in its own transaction: its row and the answer commit together, and that answer is sent', async () => {
    const k = key();
    const recovery = api.app.get(PaymentRecovery);
    const paid = { payment_id: randomUUID(), amount: 650 };
    recovery.atProvider.set(operation(k), paid);
    await diedHolding(k);
    const before = runs;
    try {
      // The recovery's transaction fails after storing: neither the row nor the answer is kept, and the key stays a
      // dead request's.
      recovery.failAfterStore = true;
      await pay(k, { amount: 650 }).expect(500);
      expect(await effects(k)).toBe(0);
      expect(await record(k)).toMatchObject({ state: 'running' });
      recovery.failAfterStore = false;

      const answer = await pay(k, { amount: 650 }).expect(201);
      expect(answer.body).toEqual({ ...paid, recovered: true });
      expect(answer.headers.location).toBe(`/test/payments/${paid.payment_id}`);
      expect(runs).toBe(before);
      expect(await effects(k)).toBe(1);
      const stored = await record(k);
      expect(stored).toMatchObject({ state: 'completed', status: 201 });
      expect(JSON.parse(stored!.body)).toEqual(answer.body);
      const replay = await pay(k, { amount: 650 }).expect(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual(answer.body);
    } finally {
      recovery.failAfterStore = false;
      recovery.atProvider.delete(operation(k));
    }
  });

  it('runs the handler after a dead request that did nothing (the recovery finds no effect)', async () => {
    const k = key();
    await diedHolding(k);
    const recovery = api.app.get(PaymentRecovery);
    const recoveries = recovery.recoveries;
    const before = runs;
    const answer = await pay(k, { amount: 300 }).expect(201);
    expect(answer.body).toMatchObject({ amount: 300 });
    expect(answer.body.recovered).toBeUndefined();
    expect(recovery.recoveries).toBe(recoveries + 1);
    expect(runs).toBe(before + 1);
    expect(await effects(k)).toBe(1);
  });

  it('keeps a key whose outcome is unknown for the next request to recover, never simply freed', async () => {
    const k = key();
    const recovery = api.app.get(PaymentRecovery);
    // The handler cannot tell what the provider did: 503, and the key stays a dead request's.
    const unknown = await pay(k, { amount: 400, unknownOutcome: true }).expect(503);
    expect(unknown.headers['retry-after']).toBe('1');
    expect(await record(k)).toMatchObject({ state: 'running' });
    // The retry takes the key over knowingly: the recovery looks first; the provider cannot be asked either.
    recovery.unavailable = true;
    const recoveries = recovery.recoveries;
    const before = runs;
    try {
      await pay(k, { amount: 400, unknownOutcome: true }).expect(503);
    } finally {
      recovery.unavailable = false;
    }
    expect(recovery.recoveries).toBe(recoveries + 1);
    expect(runs).toBe(before);
    expect(await record(k)).toMatchObject({ state: 'running' });
    // Once it can be asked and finds nothing, the request runs (here: pays).
    await pay(k, { amount: 400, unknownOutcome: true }).expect(503); // this run, too, could not tell
    expect(recovery.recoveries).toBe(recoveries + 2);
    expect(runs).toBe(before + 1);
  });

  it('refuses a route naming a store the module does not have, at start-up', async () => {
    @Controller('test/nowhere')
    class NowhereController {
      @Post()
      @Idempotent({ store: 'nowhere' })
      go(): object {
        return {};
      }
    }
    @Module({ controllers: [NowhereController] })
    class NowhereModule {}
    await expect(startApi({ imports: [NowhereModule] })).rejects.toThrow(
      /no store named "nowhere" \(IdempotencyModule's stores: redis, postgres\)/,
    );
  });

  it('refuses, at start-up, a recovery hook that is no provider, or on a store that cannot tell a request died', async () => {
    class NotProvided implements IdempotencyRecovery {
      recover(): Promise<undefined> {
        return Promise.resolve(undefined);
      }
    }
    @Controller('test/unrecoverable')
    class UnrecoverableController {
      @Post('a')
      @Idempotent({ store: 'postgres', recover: NotProvided })
      a(): object {
        return {};
      }

      @Post('b')
      @Idempotent({ store: 'redis', recover: PaymentRecovery })
      b(): object {
        return {};
      }
    }
    @Module({ controllers: [UnrecoverableController], providers: [PaymentRecovery] })
    class UnrecoverableModule {}
    const failure = startApi({ imports: [UnrecoverableModule] });
    await expect(failure).rejects.toThrow(
      /UnrecoverableController\.a: recover names NotProvided, which is not a provider of the app/,
    );
    await expect(failure).rejects.toThrow(
      /UnrecoverableController\.b: recover needs a store that can tell a request that died/,
    );
  });
});
