import { Body, Controller, HttpCode, Module, Post, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import express from 'express';
import type { AddressInfo } from 'node:net';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { brotliCompressSync } from 'node:zlib';
import { loadApiConfig } from '../../apps/api/src/api.config';
import { ApiModule } from '../../apps/api/src/api.module';
import { createApiApp, MAX_BODY_BYTES, MAX_JSON_MEMBERS, MAX_JSON_VALUES } from '../../apps/api/src/create-api-app';
import { CreateSummaryDto } from '../../apps/api/src/summaries/create-summary.dto';

export interface HostileResult {
  readonly app: string;
  readonly shape: string;
  readonly bytes: number;
  readonly status: number;
  readonly answerBytes: number;
  readonly medianMs: number;
  readonly maxMs: number;
  /** The longest the event loop was blocked while these requests ran (monitorEventLoopDelay, 1 ms resolution). */
  readonly loopMaxMs: number;
}

const KEY = 'bench-hostile-0123456789abcdef';

interface Shape {
  readonly name: string;
  readonly body: Buffer;
  readonly headers?: Record<string, string>;
  /** Also sent to the stock Nest app (each costs it seconds, so only the telling ones). */
  readonly stock?: boolean;
}

const fields = (n: number, from = 0) => Array.from({ length: n }, (_, i) => `"f${from + i}":0`).join(',');

/** Bodies within 1 MiB made to cost as much as possible, and a valid one for scale. */
function corpus(): Shape[] {
  const ninetyK = `{"text":"x","notify":"a@example.com",${fields(90_000)}}`;
  const members = `{${Array.from({ length: MAX_JSON_MEMBERS - 1 }, (_, i) => `"k${i}":0`).join(',')}}`;
  const objectsAtLimits = Math.floor(MAX_JSON_VALUES / MAX_JSON_MEMBERS) - 1;
  const shapes: Shape[] = [
    { name: '90,000 unknown fields', body: Buffer.from(ninetyK), stock: true },
    {
      name: '90,000 unknown fields, brotli (67 KB sent)',
      body: brotliCompressSync(ninetyK),
      headers: { 'content-encoding': 'br' },
    },
    {
      name: `${MAX_JSON_MEMBERS - 3} unknown fields (under the member limit)`,
      body: Buffer.from(`{"text":"x","notify":"a@example.com",${fields(MAX_JSON_MEMBERS - 3)}}`),
      stock: true,
    },
    {
      name: `${objectsAtLimits} objects of ${MAX_JSON_MEMBERS - 1} members under text`,
      body: Buffer.from(`{"text":[${Array(objectsAtLimits).fill(members).join(',')}],"notify":"a@example.com"}`),
      stock: true,
    },
    {
      name: `${MAX_JSON_VALUES - 10} numbers under text`,
      body: Buffer.from(
        `{"text":[${Array(MAX_JSON_VALUES - 10)
          .fill(0)
          .join(',')}],"notify":"a@example.com"}`,
      ),
      stock: true,
    },
    {
      name: `${MAX_JSON_VALUES - 10} 45-character strings in an unknown field`,
      body: Buffer.from(
        `{"text":"x","notify":"a@example.com","t":[${Array(MAX_JSON_VALUES - 10)
          .fill(`"${'y'.repeat(45)}"`)
          .join(',')}]}`,
      ),
    },
    {
      name: '500,000 numbers (past the value limit)',
      body: Buffer.from(`{"text":[${Array(500_000).fill(0).join(',')}]}`),
      stock: true,
    },
    {
      name: '1 MiB of whitespace text, a 300-character notify',
      body: Buffer.from(JSON.stringify({ text: ' '.repeat(MAX_BODY_BYTES - 400), notify: 'a'.repeat(300) })),
    },
    {
      name: '1 MiB of \\u0000 escapes in text',
      body: Buffer.from(
        `{"text":"${'\\u0000'.repeat(Math.floor((MAX_BODY_BYTES - 100) / 6))}","notify":"a@example.com"}`,
      ),
    },
    {
      name: '1 MiB that is not JSON at its last byte',
      body: Buffer.from(`{"text":"${'x'.repeat(MAX_BODY_BYTES - 100)}",`),
    },
    { name: 'brackets 100,000 deep', body: Buffer.from(`${'['.repeat(100_000)}${']'.repeat(100_000)}`) },
    {
      name: '5,000 levels in UTF-7 (brackets hidden from a byte scan)',
      body: Buffer.from(
        `+${Buffer.from(`${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}`, 'utf16le')
          .swap16()
          .toString('base64')}-`,
      ),
      headers: { 'content-type': 'application/json; charset=utf-7' },
      stock: true,
    },
    {
      name: 'a valid request, 100,000-character text',
      body: Buffer.from(JSON.stringify({ text: 'x'.repeat(100_000), notify: 'a@example.com' })),
    },
  ];
  for (const s of shapes)
    if (s.body.length > MAX_BODY_BYTES) throw new Error(`${s.name}: ${s.body.length} bytes, over the limit`);
  return shapes;
}

async function measure(
  app: string,
  url: string,
  shape: Shape,
  times: number,
  key: () => string,
): Promise<HostileResult> {
  const latencies: number[] = [];
  let status = 0;
  let answerBytes = 0;
  const loop = monitorEventLoopDelay({ resolution: 1 });
  loop.enable();
  for (let i = 0; i < times; i++) {
    const t0 = performance.now();
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${KEY}`,
        'content-type': 'application/json',
        'idempotency-key': key(),
        ...shape.headers,
      },
      body: shape.body,
    });
    const text = await res.text();
    latencies.push(performance.now() - t0);
    status = res.status;
    answerBytes = Buffer.byteLength(text);
  }
  loop.disable();
  latencies.sort((a, b) => a - b);
  return {
    app,
    shape: shape.name,
    bytes: shape.body.length,
    status,
    answerBytes,
    medianMs: +latencies[Math.floor(latencies.length / 2)].toFixed(1),
    maxMs: +latencies[latencies.length - 1].toFixed(1),
    loopMaxMs: +(loop.max / 1e6).toFixed(1),
  };
}

@Controller('v1/summaries')
class StockController {
  @Post()
  @HttpCode(202)
  create(@Body() body: CreateSummaryDto): { ok: true } {
    void body;
    return { ok: true };
  }
}

@Module({ controllers: [StockController] })
class StockModule {}

/**
 * What a team gets without this project's limits: Nest's own ValidationPipe
 * (whitelist, forbidNonWhitelisted, transform) behind express.json with the
 * same 1 MiB limit, on the same DTO.
 */
async function startStock(): Promise<NestExpressApplication> {
  const app = await NestFactory.create<NestExpressApplication>(StockModule, { bodyParser: false, logger: false });
  app.use(express.json({ limit: MAX_BODY_BYTES }));
  app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true, transform: true }));
  await app.listen(0, '127.0.0.1');
  return app;
}

const urlOf = (app: NestExpressApplication) =>
  `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}/v1/summaries`;

export async function benchHostileInput(redisUrl: string, databaseUrl: string): Promise<HostileResult[]> {
  const config = loadApiConfig({
    REDIS_URL: redisUrl,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    API_KEYS: `bench:${KEY}`,
  });
  const ours = (await createApiApp(ApiModule.forRoot(config))) as NestExpressApplication;
  await ours.listen(0, '127.0.0.1');
  const stock = await startStock();
  const shapes = corpus();
  let n = 0;
  const key = () => `hostile-${process.pid}-${n++}-0123456789`;
  const results: HostileResult[] = [];
  try {
    // Warm both up (JIT, connections) on every shape once.
    for (const shape of shapes) await measure('warm-up', urlOf(ours), shape, 1, key);
    for (const shape of shapes) results.push(await measure('this project', urlOf(ours), shape, 7, key));
    for (const shape of shapes.filter((s) => s.stock))
      results.push(await measure('stock Nest ValidationPipe', urlOf(stock), shape, 1, key));
  } finally {
    await ours.close();
    await stock.close();
  }
  return results;
}
