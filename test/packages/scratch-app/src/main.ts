/*
 * A Nest app of someone else's, as its README tells them to write it: the
 * packed @llm-workflows/nestjs-idempotency from npm, no path aliases. The
 * packages test copies this folder to a temporary one, installs the
 * tarballs, compiles it with tsc and drives it over HTTP.
 *
 * POST /orders counts its runs (GET /runs) and, while POST /hold has armed
 * it, waits inside the handler until POST /release: a storm of duplicates
 * meets the first request still running. POST /pg-orders is the same route
 * on the PostgreSQL store, on tables made from IDEMPOTENCY_SCHEMA_SQL.
 */
import 'reflect-metadata';
import { Body, Controller, Get, HttpCode, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  DirectAnswerExpressAdapter,
  IdempotencyModule,
  Idempotent,
  ProblemDetailsFilter,
  RedisIdempotencyStore,
} from '@llm-workflows/nestjs-idempotency';
import { IDEMPOTENCY_SCHEMA_SQL, PostgresIdempotencyStore } from '@llm-workflows/nestjs-idempotency/postgres';
import { Redis } from 'ioredis';
import { Pool } from 'pg';

interface OrderRequest {
  readonly sku: string;
  readonly quantity: number;
}

let runs = 0;
let held: { release: () => void; promise: Promise<void> } | undefined;

@Controller()
class OrdersController {
  @Post('orders')
  @Idempotent()
  async create(@Body() order: OrderRequest): Promise<{ order: number; sku: string; quantity: number }> {
    const n = ++runs;
    await held?.promise;
    return { order: n, sku: order.sku, quantity: order.quantity };
  }

  @Post('pg-orders')
  @Idempotent({ store: 'postgres' })
  createInPostgres(@Body() order: OrderRequest): { order: number; sku: string } {
    return { order: ++runs, sku: order.sku };
  }

  @Get('runs')
  count(): { runs: number } {
    return { runs };
  }

  @Post('hold')
  @HttpCode(204)
  hold(): void {
    let release = (): void => undefined;
    const promise = new Promise<void>((resolve) => (release = resolve));
    held = { release, promise };
  }

  @Post('release')
  @HttpCode(204)
  release(): void {
    held?.release();
    held = undefined;
  }
}

async function main(): Promise<void> {
  const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
  const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 4 });
  await pool.query(IDEMPOTENCY_SCHEMA_SQL);

  @Module({
    imports: [
      IdempotencyModule.forRoot({
        store: new RedisIdempotencyStore(redis, { prefix: process.env.KEY_PREFIX }),
        stores: { postgres: new PostgresIdempotencyStore(pool) },
        // Whose keys these are: a real app takes the principal its guards established.
        scope: () => 'scratch-tenant',
      }),
    ],
    controllers: [OrdersController],
  })
  class AppModule {}

  // Replays written straight to the response: on Nest 11 the only way they are sent; Nest 12's own router
  // sends them too (NEST_DEFAULT_ADAPTER=1 runs it on Nest's default adapter, as most Nest 12 apps are).
  const logger: ('error' | 'warn')[] = ['error', 'warn'];
  const app =
    process.env.NEST_DEFAULT_ADAPTER === '1'
      ? await NestFactory.create(AppModule, { logger })
      : await NestFactory.create(AppModule, new DirectAnswerExpressAdapter(), { logger });
  // Errors as problem+json, with their headers (a 409's Retry-After).
  app.useGlobalFilters(new ProblemDetailsFilter());
  app.enableShutdownHooks();
  await app.listen(Number(process.env.PORT), '127.0.0.1');
  console.log(JSON.stringify({ listening: Number(process.env.PORT) }));
}

void main();
