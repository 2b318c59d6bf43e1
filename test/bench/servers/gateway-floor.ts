import { hash, randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { pino, destination } from 'pino';
import { fingerprintBody, RedisIdempotencyStore } from '@app/idempotency';
import { NodeHttpTransport, readBody } from '@app/http';
import { createRedisClient } from '@app/redis';

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
 */

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
  const upstream = await transport.send(
    'POST',
    'chat/completions',
    raw,
    {
      'content-type': 'application/json',
      'content-length': raw.length,
      authorization: upstreamAuth,
      ...(record ? { 'idempotency-key': record.operation } : {}),
    },
    new AbortController().signal,
  );
  const body = await readBody(upstream);
  const headers = { 'content-type': upstream.headers['content-type'] ?? 'application/json' };
  if (record && upstream.statusCode === 200) {
    const stored = { status: 200, headers, body };
    await store.complete(record.operation, record.token, record.fingerprint, stored, 86_400_000);
  }
  answer(res, upstream.statusCode ?? 502, headers, body);
}

const server = createServer({ keepAlive: true }, (req, res) => {
  const started = performance.now();
  const id = randomUUID();
  res.setHeader('x-request-id', id);
  res.once('finish', () =>
    log.info(
      {
        req: { id, method: req.method, url: req.url },
        res: { statusCode: res.statusCode },
        responseTime: Math.round(performance.now() - started),
      },
      'request completed',
    ),
  );
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    call(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)).catch((err: unknown) => {
      if (!res.headersSent) answer(res, 500, {}, Buffer.from(String(err)));
      else res.destroy();
    });
  });
});

void redis.connect().then(() =>
  server.listen(Number(process.env.PORT), '127.0.0.1', () => {
    process.stderr.write(`gateway floor listening on ${process.env.PORT}\n`);
  }),
);
