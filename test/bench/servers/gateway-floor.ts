import { hash, randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { pino, destination } from 'pino';
import { fingerprintBody, RedisIdempotencyStore } from '@app/idempotency';
import { NodeHttpTransport, readBody } from '@app/http';
import { createRedisClient } from '@app/redis';
import { uuidV5 } from '@app/ids';
import { scanJsonLimits } from '@app/problem/json-limits';
import { Counter, Histogram, Registry } from 'prom-client';

/*
 * The gateway bench's floor (issue 22): POST /v1/chat/completions made of the
 * parts of ours that every keyed call needs, with no framework around them.
 * The key's digest compared as the guard compares it, the body read and
 * parsed, its fingerprint (canonical JSON of the bytes), the claim and the
 * completion on the same RedisIdempotencyStore, the call on the same
 * NodeHttpTransport, a replay answered from the record, and one access-log
 * line of the api's shape through pino (a plain `info`, not pino-http's
 * per-request logger). Not in it: Nest, Express, the body parser and its
 * limits, metrics, tracing, the error envelope, the lock's renewal, the
 * gateway's routing, pinning, usage and token rules. Not a product: a yardstick for how
 * far a gateway without Nest and Express in its path could go.
 *
 * FLOOR_FEATURES=1 adds the per-call work of the features the api has and the
 * floor leaves out, done as plainly: the body's structural limits, the HTTP and
 * gateway metrics (prom-client, the api's label sets), a per-request child
 * logger for the access line, the lock's renewal timer, the call's timeout
 * timer and abort signal, the upstream key derived from the operation (UUIDv5),
 * and the answer parsed for its usage, counted per tenant. How far a plain
 * handler with the features, and without Nest's per-request machinery, could go.
 */
const FEATURES = process.env.FLOOR_FEATURES === '1';

const [tenant, key] = (process.env.API_KEYS ?? '').split(':');
const keyDigest = hash('sha256', key, 'buffer');
const log = pino(
  { level: 'info', base: { app: 'gateway-floor' }, messageKey: 'msg' },
  destination({ dest: 1, sync: false, minLength: 4096, periodicFlush: 50 }),
);
const redis = createRedisClient({ url: process.env.REDIS_URL!, connectionName: 'gateway-floor' });
const store = new RedisIdempotencyStore(redis);
const transport = new NodeHttpTransport({ baseUrl: process.env.OPENAI_BASE_URL!, maxSockets: Infinity });
const upstreamAuth = `Bearer ${process.env.OPENAI_API_KEY}`;

/** FLOOR_FEATURES' metrics, as the api's (names and labels; the values are not read here). */
const registry = new Registry();
const metrics = {
  http: new Histogram({
    name: 'http_request_duration_seconds',
    help: 'HTTP requests',
    labelNames: ['method', 'route', 'status_code'],
    registers: [registry],
  }),
  calls: new Counter({ name: 'gateway_calls_total', help: 'calls', labelNames: ['outcome'], registers: [registry] }),
  upstream: new Counter({
    name: 'gateway_upstream_calls_total',
    help: 'upstream calls',
    labelNames: ['upstream', 'outcome'],
    registers: [registry],
  }),
  tokens: new Counter({
    name: 'gateway_tokens_total',
    help: 'tokens',
    labelNames: ['tenant', 'kind'],
    registers: [registry],
  }),
  firstByte: new Histogram({
    name: 'gateway_first_byte_seconds',
    help: 'first byte',
    labelNames: ['leg', 'stream'],
    registers: [registry],
  }),
};
const JSON_LIMITS = { maxDepth: 64, maxMembers: 10_000, maxValues: 100_000 };
const UPSTREAM_KEY_NAMESPACE = '6ba7b811-9dad-11d1-80b4-00c04fd430c8';

function answer(res: ServerResponse, status: number, headers: Record<string, string>, body: Buffer): void {
  res.writeHead(status, { ...headers, 'content-length': body.length });
  res.end(body);
}

async function call(req: IncomingMessage, res: ServerResponse, raw: Buffer): Promise<void> {
  const bearer = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1];
  if (bearer === undefined || !timingSafeEqual(hash('sha256', bearer, 'buffer'), keyDigest)) {
    answer(res, 401, {}, Buffer.from('{"error":{"code":"invalid_api_key"}}'));
    return;
  }
  if (FEATURES && scanJsonLimits(raw, JSON_LIMITS)) {
    answer(res, 400, {}, Buffer.from('{"error":{"code":"invalid_request_error"}}'));
    return;
  }
  const json = JSON.parse(raw.toString('utf8')) as unknown;
  const idempotencyKey = req.headers['idempotency-key'];
  const record =
    typeof idempotencyKey === 'string'
      ? {
          operation: `${tenant}:POST:/v1/chat/completions:${idempotencyKey}`,
          token: randomUUID(),
          fingerprint: fingerprintBody(json, raw),
        }
      : undefined;
  if (record) {
    const claim = await store.claim(record.operation, record.token, record.fingerprint, 300_000);
    if (claim.outcome === 'completed') {
      const { status, headers, body } = claim.response;
      answer(res, status, { ...(headers as Record<string, string>), 'idempotent-replayed': 'true' }, body);
      return;
    }
    if (claim.outcome !== 'claimed') {
      answer(res, 409, {}, Buffer.from('{"error":{"code":"idempotency_key_in_use"}}'));
      return;
    }
  }
  // FLOOR_FEATURES: the lock's renewal timer, and the call's timeout and its abort signal.
  const renewal = FEATURES && record ? setTimeout(() => undefined, 5_000).unref() : undefined;
  const stop = new AbortController();
  const timeout = FEATURES ? setTimeout(() => stop.abort(), 300_000).unref() : undefined;
  const sent = performance.now();
  const upstream = await transport.send(
    'POST',
    'chat/completions',
    raw,
    {
      'content-type': 'application/json',
      'content-length': raw.length,
      authorization: upstreamAuth,
      ...(record
        ? { 'idempotency-key': FEATURES ? uuidV5(record.operation, UPSTREAM_KEY_NAMESPACE) : record.operation }
        : {}),
    },
    stop.signal,
  );
  if (FEATURES) metrics.firstByte.observe({ leg: 'upstream', stream: 'false' }, (performance.now() - sent) / 1000);
  const body = await readBody(upstream);
  if (FEATURES) {
    clearTimeout(timeout);
    metrics.upstream.inc({ upstream: 'default', outcome: 'answered' });
    const { usage } = JSON.parse(body.toString('utf8')) as {
      usage?: { prompt_tokens: number; completion_tokens: number };
    };
    if (usage) {
      metrics.tokens.inc({ tenant, kind: 'prompt' }, usage.prompt_tokens);
      metrics.tokens.inc({ tenant, kind: 'completion' }, usage.completion_tokens);
    }
    metrics.calls.inc({ outcome: record ? 'new' : 'forwarded' });
  }
  const headers = { 'content-type': upstream.headers['content-type'] ?? 'application/json' };
  if (record && upstream.statusCode === 200) {
    const stored = { status: 200, headers, body };
    await store.complete(record.operation, record.token, record.fingerprint, stored, 86_400_000);
  }
  clearTimeout(renewal);
  if (FEATURES) metrics.firstByte.observe({ leg: 'caller', stream: 'false' }, (performance.now() - sent) / 1000);
  answer(res, upstream.statusCode ?? 502, headers, body);
}

const server = createServer({ keepAlive: true }, (req, res) => {
  const started = performance.now();
  const id = randomUUID();
  res.setHeader('x-request-id', id);
  // FLOOR_FEATURES: a child logger a request (as pino-http makes one), and the HTTP metric.
  const reqLog = FEATURES ? log.child({ req_id: id }) : log;
  res.once('finish', () => {
    if (FEATURES)
      metrics.http.observe(
        { method: req.method ?? 'POST', route: '/v1/chat/completions', status_code: res.statusCode },
        (performance.now() - started) / 1000,
      );
    reqLog.info(
      {
        req: { id, method: req.method, url: req.url },
        res: { statusCode: res.statusCode },
        responseTime: Math.round(performance.now() - started),
      },
      'request completed',
    );
  });
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    call(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)).catch((err: unknown) => {
      if (!res.headersSent) answer(res, 500, {}, Buffer.from(String(err)));
      else res.destroy();
    });
  });
});

// FLOOR_PORT: its port when it shares a process with ours (servers/ours-with-floor.ts), whose PORT is the api's.
const port = process.env.FLOOR_PORT ?? process.env.PORT;
void redis.connect().then(() =>
  server.listen(Number(port), '127.0.0.1', () => {
    process.stderr.write(`gateway floor listening on ${port}\n`);
  }),
);
