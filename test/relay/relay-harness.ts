import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModule, type TestingModuleBuilder } from '@nestjs/testing';
import { SUMMARY_READY_TOPIC } from '@app/summary-queue';
import { dataSourceOptions, OUTBOX_CHANNEL } from '@app/persistence';
import { Logger } from 'nestjs-pino';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import { DataSource } from 'typeorm';
import { OutboxListener } from '../../apps/relay/src/outbox/outbox-listener';
import { OutboxRelay } from '../../apps/relay/src/outbox/outbox.relay';
import { loadRelayConfig, type RelayConfig } from '../../apps/relay/src/relay.config';
import { RelayModule } from '../../apps/relay/src/relay.module';
import { freePort, testDatabaseUrl, testRedisUrl, truncateAll } from '../support/infra';

/* ------------------------------------------------------------------ the provider */

export interface Delivery {
  readonly method: string;
  readonly path: string;
  readonly idempotencyKey: string | undefined;
  readonly contentType: string | undefined;
  readonly authorization: string | undefined;
  readonly userAgent: string | undefined;
  readonly rawBody: string;
  readonly body: { topic?: unknown; dedupe_key?: unknown; payload?: unknown };
  readonly receivedAt: number;
  /** When the answer went out (undefined while held or never). */
  answeredAt?: number;
}

/** How the provider answers a request: the status, after an optional delay, or once `after` settles. */
export type Answer = { readonly status: number; readonly delayMs?: number; readonly after?: Promise<unknown> } | 'hang';

/**
 * The email provider, out of our walls: a real HTTP server on a loopback port
 * that records every request it receives (before answering), so tests count
 * deliveries per Idempotency-Key, not only row states.
 */
export class FakeProvider {
  readonly deliveries: Delivery[] = [];
  /** Decides each answer; `n` counts earlier requests with the same key. Default: 200 at once. */
  answer: (d: Delivery, n: number) => Answer = () => ({ status: 200 });
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly listeners = new Set<(d: Delivery) => void>();
  private readonly server: Server = createServer((req, res) => this.handle(req, res));

  /** Not listening yet: see `listen()`, or `FakeProvider.start`. */
  constructor(readonly port: number) {}

  static async start(port: number): Promise<FakeProvider> {
    const provider = new FakeProvider(port);
    await provider.listen();
    return provider;
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, '127.0.0.1', () => resolve());
    });
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/notify`;
  }

  /** Called with each request as it arrives (before it is answered). */
  onRequest(listener: (d: Delivery) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  deliveriesFor(key: string): Delivery[] {
    return this.deliveries.filter((d) => d.idempotencyKey === key);
  }

  /** Requests per Idempotency-Key. */
  countsByKey(): Map<string, number> {
    const counts = new Map<string, number>();
    for (const d of this.deliveries) counts.set(d.idempotencyKey ?? '', (counts.get(d.idempotencyKey ?? '') ?? 0) + 1);
    return counts;
  }

  reset(): void {
    this.deliveries.length = 0;
    this.answer = () => ({ status: 200 });
  }

  async close(): Promise<void> {
    for (const t of this.timers) clearTimeout(t);
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const rawBody = Buffer.concat(chunks).toString('utf8');
      let body: Delivery['body'] = {};
      try {
        body = JSON.parse(rawBody) as Delivery['body'];
      } catch {
        // recorded as received; the assertions see the raw body
      }
      const key = req.headers['idempotency-key'];
      const delivery: Delivery = {
        method: req.method ?? '',
        path: req.url ?? '',
        idempotencyKey: typeof key === 'string' ? key : undefined,
        contentType: req.headers['content-type'],
        authorization: req.headers.authorization,
        userAgent: req.headers['user-agent'],
        rawBody,
        body,
        receivedAt: Date.now(),
      };
      const earlier = this.deliveries.filter((d) => d.idempotencyKey === delivery.idempotencyKey).length;
      this.deliveries.push(delivery);
      for (const l of this.listeners) l(delivery);
      const answer = this.answer(delivery, earlier);
      if (answer === 'hang') return;
      const respond = () => {
        delivery.answeredAt = Date.now();
        res.writeHead(answer.status, { 'Content-Type': 'application/json' }).end('{"ok":true}');
      };
      if (answer.after) {
        void answer.after.then(respond, respond);
        return;
      }
      if (!answer.delayMs) return respond();
      const timer = setTimeout(() => {
        this.timers.delete(timer);
        respond();
      }, answer.delayMs);
      this.timers.add(timer);
    });
  }
}

/* ------------------------------------------------------------------ the suite */

export interface RelayFixture {
  /** The test's own pool on this worker's database (not the relay's), open from beforeAll to afterAll. */
  readonly ds: DataSource;
  /** Listening from beforeAll to afterAll; reset before each test. */
  readonly provider: FakeProvider;
}

export interface RelayFixtureHooks {
  /** Last in beforeAll, once the pool and the provider are up (e.g. the suite's relay). */
  readonly setUp?: () => Promise<void>;
  /** First in afterAll, before the provider and the pool close. */
  readonly tearDown?: () => Promise<void>;
}

/**
 * The fixture of a relay suite, called at the top of its describe block: a
 * pool on this worker's database and a FakeProvider on `freePort(portOffset)`
 * for the whole block, and before each test the tables emptied and the
 * provider reset. Both objects exist at once, so the suite can destructure
 * them; they are opened in beforeAll.
 */
export function relayFixture(portOffset: number, hooks: RelayFixtureHooks = {}): RelayFixture {
  // What testDataSource() opens, made here so it can be handed out before beforeAll runs.
  const ds = new DataSource(dataSourceOptions({ url: testDatabaseUrl(), applicationName: 'test' }));
  const provider = new FakeProvider(freePort(portOffset));
  let setUp = false;
  beforeAll(async () => {
    await ds.initialize();
    await provider.listen();
    await hooks.setUp?.();
    setUp = true;
  });
  afterAll(async () => {
    // A setUp that threw left nothing to tear down, and its error is the one to see.
    if (setUp) await hooks.tearDown?.();
    await provider.close();
    await ds.destroy();
  });
  beforeEach(async () => {
    await truncateAll(ds);
    provider.reset();
  });
  return { ds, provider };
}

/* ------------------------------------------------------------------ the relay */

/** The relay's configuration as an operator would set it, on this worker's databases. */
export function relayConfig(env: Record<string, string> = {}): RelayConfig {
  return loadRelayConfig({
    REDIS_URL: testRedisUrl(),
    DATABASE_URL: testDatabaseUrl(),
    LOG_LEVEL: 'silent',
    ...env,
  });
}

export interface RelayHarness {
  readonly moduleRef: TestingModule;
  readonly relay: OutboxRelay;
  readonly listener: OutboxListener;
  readonly registry: Registry;
  /** The relay's own pool (PostgreSQL). */
  readonly dataSource: DataSource;
  readonly config: RelayConfig;
  /** Only for started relays. */
  readonly app?: INestApplication;
  close(): Promise<void>;
}

export interface RelayHarnessOptions {
  readonly env?: Record<string, string>;
  readonly override?: (builder: TestingModuleBuilder) => TestingModuleBuilder;
}

/**
 * The relay's module graph as main.ts builds it, but not started: no loop, no
 * LISTEN, no timers. The test drives it with `relay.runOnce()`.
 */
export async function compileRelay(options: RelayHarnessOptions = {}): Promise<RelayHarness> {
  const config = relayConfig(options.env);
  let builder = Test.createTestingModule({ imports: [RelayModule.forRoot(config)] });
  if (options.override) builder = options.override(builder);
  const moduleRef = await builder.compile();
  moduleRef.useLogger(moduleRef.get(Logger));
  return harness(moduleRef, config, undefined, () => moduleRef.close());
}

/** The relay app, started (loop, LISTEN, retention), with its HTTP server for health and metrics. */
export async function startRelay(options: RelayHarnessOptions = {}): Promise<RelayHarness & { app: INestApplication }> {
  const config = relayConfig(options.env);
  let builder = Test.createTestingModule({ imports: [RelayModule.forRoot(config)] });
  if (options.override) builder = options.override(builder);
  const moduleRef = await builder.compile();
  const app = moduleRef.createNestApplication({ bufferLogs: true });
  app.useLogger(app.get(Logger));
  await app.init();
  return harness(moduleRef, config, app, () => app.close()) as RelayHarness & { app: INestApplication };
}

function harness(
  moduleRef: TestingModule,
  config: RelayConfig,
  app: INestApplication | undefined,
  close: () => Promise<void>,
): RelayHarness {
  const get = <T>(token: abstract new (...args: never[]) => T): T => (app ?? moduleRef).get(token);
  return {
    moduleRef,
    relay: get(OutboxRelay),
    listener: get(OutboxListener),
    registry: get(Registry),
    dataSource: get(DataSource),
    config,
    app,
    close,
  };
}

/* ------------------------------------------------------------------ rows */

export const TOPIC = SUMMARY_READY_TOPIC;

/**
 * Outbox rows as the worker writes them (one transaction, NOTIFY per row
 * delivered at commit), with dedupe keys `<prefix>:<n>`. Returns the keys in id order.
 */
export async function insertOutboxRows(
  ds: DataSource,
  count: number,
  prefix: string,
  notify = true,
): Promise<string[]> {
  const rows: { dedupe_key: string }[] = await ds.query(
    `WITH row AS (
       INSERT INTO outbox (topic, dedupe_key, payload)
       SELECT $1, $2 || ':' || g, jsonb_build_object('job_id', $2 || '-' || g, 'to', 'someone@example.com')
         FROM generate_series(1, $3::integer) AS g
       RETURNING id, dedupe_key
     )
     SELECT dedupe_key, CASE WHEN $4::boolean THEN pg_notify('${OUTBOX_CHANNEL}', id::text) END AS notified
       FROM row ORDER BY id`,
    [TOPIC, prefix, count, notify],
  );
  return rows.map((r) => r.dedupe_key);
}

export interface OutboxRowState {
  id: string;
  dedupe_key: string;
  attempts: number;
  last_error: string | null;
  sent_at: Date | null;
  parked_at: Date | null;
  lease_until: Date | null;
  next_attempt_at: Date;
  /** next_attempt_at - now(), in ms, by PostgreSQL's clock. */
  due_in_ms: number;
}

export async function rowByKey(ds: DataSource, key: string): Promise<OutboxRowState> {
  const rows: OutboxRowState[] = await ds.query(
    `SELECT id, dedupe_key, attempts, last_error, sent_at, parked_at, lease_until, next_attempt_at,
            (extract(epoch FROM next_attempt_at - now()) * 1000)::float8 AS due_in_ms
       FROM outbox WHERE dedupe_key = $1`,
    [key],
  );
  if (rows.length !== 1) throw new Error(`expected one outbox row ${key}, found ${rows.length}`);
  return rows[0];
}

/** The value of one sample in a registry, 0 when absent. */
export async function sample(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await registry.metrics();
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)$/.exec(line);
    if (!match || match[1] !== name) continue;
    const have = (match[3] ?? '').split(',').filter(Boolean);
    if (have.length === wanted.length && wanted.every((w) => have.includes(w))) return Number(match[4]);
  }
  return 0;
}
