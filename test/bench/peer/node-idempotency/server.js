'use strict';
/*
 * The "peer" side of test/bench/api-side-by-side.bench.ts: POST /v1/summaries
 * made idempotent by @node-idempotency/nestjs 1.0.4 with its Redis storage
 * adapter (@node-idempotency/storage-adapter-redis 1.0.2, node-redis 4), on
 * Nest 10 (its peerDependencies accept ^9 || ^10.3.8, not the root's 12).
 *
 * The request does what the api's route does, as near as Nest 10 lets it:
 * - one pino-http line per answer through nestjs-pino (the same options as
 *   libs/observability's LoggingModule: request id, redaction, serializers);
 * - the latency histogram of every answer (prom-client, the same buckets and
 *   labels as HttpMetricsMiddleware, on a registry of its own with the
 *   default metrics);
 * - Authorization: Bearer checked against SHA-256 digests with
 *   timingSafeEqual, as ApiKeyGuard does;
 * - the same DTO constraints through Nest's ValidationPipe (whitelist,
 *   forbidNonWhitelisted, transform);
 * - the same enqueue: the api's one-script job record + XADD, through ioredis
 *   6 (the root's client), EVALSHA as the api's RedisScript sends it.
 * What differs: Nest's default JSON body parser (express 4, 100 kB limit),
 * not the api's useJsonBody with its structural limits; Nest's own exception
 * filter, not problem+json; no OpenAPI document; and idempotency as the peer
 * does it (SET NX, the handler, SET; a replay SET NX then GET), scoped by
 * method, path and key, not by tenant.
 *
 * Plain JavaScript with the decorators applied by hand (Reflect.decorate,
 * design:paramtypes set where TypeScript would emit it), so the folder needs
 * no compiler. Configuration: PORT, REDIS_URL, LOG_LEVEL, API_KEYS
 * (`tenant:key,...`). Prints `peer listening on <port>` on stderr when ready.
 */
require('reflect-metadata');
const {
  Body,
  Controller,
  HttpCode,
  Injectable,
  Module,
  Post,
  Req,
  Res,
  UseGuards,
  UnauthorizedException,
  ValidationPipe,
  ServiceUnavailableException,
} = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { NodeIdempotencyModule, Idempotent } = require('@node-idempotency/nestjs');
const { StorageAdapterEnum } = require('@node-idempotency/shared');
const { IsEmail, IsString, Length, Matches, MaxLength, ValidateBy } = require('class-validator');
const { LoggerModule, Logger } = require('nestjs-pino');
const { Histogram, Registry, collectDefaultMetrics } = require('prom-client');
const { Redis } = require('ioredis');
const { createHash, randomUUID, timingSafeEqual } = require('node:crypto');

const port = Number(process.env.PORT ?? 3000);
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const logLevel = process.env.LOG_LEVEL ?? 'info';
const apiKeys = (process.env.API_KEYS ?? 'demo:demo-key').split(',').map((entry) => {
  const [tenant, key] = entry.split(':');
  return { tenant, key };
});

const decorate = (decorators, target, key, desc) => Reflect.decorate(decorators, target, key, desc);

// The DTO: the constraints of apps/api/src/summaries/create-summary.dto.ts.
class CreateSummaryDto {}
const isStorableText = ValidateBy({
  name: 'isStorableText',
  validator: {
    validate: (v) => typeof v === 'string' && !v.includes('\u0000') && v.isWellFormed(),
    defaultMessage: () => '$property must not contain U+0000 or unpaired UTF-16 surrogates',
  },
});
decorate(
  [IsString(), Length(1, 100_000), Matches(/\S/, { message: 'text must not be only whitespace' }), isStorableText],
  CreateSummaryDto.prototype,
  'text',
);
decorate(
  [IsString(), MaxLength(254), IsEmail({}, { message: 'notify must be an email address' }), isStorableText],
  CreateSummaryDto.prototype,
  'notify',
);

// The guard: ApiKeyGuard's comparison.
const digest = (value) => createHash('sha256').update(value).digest();
const keys = apiKeys.map((e) => ({ digest: digest(e.key), tenant: e.tenant }));
class BearerGuard {
  canActivate(context) {
    const req = context.switchToHttp().getRequest();
    const values = req.headersDistinct.authorization;
    const m = values && values.length === 1 ? /^Bearer ([\x21-\x7e]+)$/.exec(values[0]) : null;
    if (!m) throw new UnauthorizedException('Send one Authorization: Bearer <api key> header.');
    const given = digest(m[1]);
    let tenant;
    for (const key of keys) if (timingSafeEqual(key.digest, given) && tenant === undefined) tenant = key.tenant;
    if (tenant === undefined) throw new UnauthorizedException('The API key is not valid.');
    req.tenant = tenant;
    return true;
  }
}
decorate([Injectable()], BearerGuard);

// The enqueue: libs/summary-queue's script, one round trip.
const ENQUEUE = `redis.call('HSET', KEYS[1], 'tenant', ARGV[2])
redis.call('HSETNX', KEYS[1], 'accepted_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[1], 'tenant', ARGV[2], 'payload', ARGV[3])`;
const ENQUEUE_SHA = createHash('sha1').update(ENQUEUE).digest('hex');
const JOB_RECORD_TTL_MS = 7 * 24 * 3600 * 1000;
const redis = new Redis(redisUrl, { connectionName: 'peer', maxRetriesPerRequest: 1 });
async function enqueue(jobId, tenant, payload) {
  const keys = [`{summaries}:job:${jobId}`, '{summaries}:jobs'];
  const args = [jobId, tenant, JSON.stringify(payload), Date.now(), JOB_RECORD_TTL_MS];
  try {
    return await redis.evalsha(ENQUEUE_SHA, keys.length, ...keys, ...args);
  } catch (err) {
    if (!String(err && err.message).includes('NOSCRIPT')) throw err;
    return redis.eval(ENQUEUE, keys.length, ...keys, ...args);
  }
}

class SummariesController {
  async create(body, req, res) {
    const jobId = randomUUID();
    try {
      await enqueue(jobId, req.tenant, { text: body.text, notify: body.notify });
    } catch {
      throw new ServiceUnavailableException('The job could not be queued');
    }
    res.location(`/v1/summaries/${jobId}`);
    return { job_id: jobId, status: 'queued' };
  }
}
Reflect.defineMetadata(
  'design:paramtypes',
  [CreateSummaryDto, Object, Object],
  SummariesController.prototype,
  'create',
);
// Parameter decorators take (target, key, index).
Body()(SummariesController.prototype, 'create', 0);
Req()(SummariesController.prototype, 'create', 1);
Res({ passthrough: true })(SummariesController.prototype, 'create', 2);
decorate(
  [Post(), Idempotent(), HttpCode(202)],
  SummariesController.prototype,
  'create',
  Object.getOwnPropertyDescriptor(SummariesController.prototype, 'create'),
);
decorate([Controller('v1/summaries'), UseGuards(BearerGuard)], SummariesController);

// The latency histogram of every answer (HttpMetricsMiddleware's).
const registry = new Registry();
collectDefaultMetrics({ register: registry });
const duration = new Histogram({
  name: 'http_request_duration_seconds',
  help: 'HTTP requests by method, route pattern and status, with their latency',
  labelNames: ['method', 'route', 'status'],
  buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  registers: [registry],
});
function metrics(req, res, next) {
  const start = process.hrtime.bigint();
  res.once('finish', () => {
    const path = req.route && req.route.path;
    duration.observe(
      { method: req.method, route: typeof path === 'string' ? path : 'unmatched', status: String(res.statusCode) },
      Number(process.hrtime.bigint() - start) / 1e9,
    );
  });
  next();
}

const REQUEST_ID = /^[\w.:-]{1,128}$/;
class PeerModule {}
decorate(
  [
    Module({
      imports: [
        LoggerModule.forRoot({
          pinoHttp: {
            level: logLevel,
            base: { app: 'peer' },
            messageKey: 'msg',
            genReqId: (req, res) => {
              const given = req.headers['x-request-id'];
              const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
              res.setHeader('X-Request-Id', id);
              return id;
            },
            redact: {
              paths: [
                'req.headers.authorization',
                'req.headers.cookie',
                'req.headers["idempotency-key"]',
                'req.headers["x-admin-key"]',
                'res.headers["set-cookie"]',
              ],
              censor: '[redacted]',
            },
            serializers: { req: (req) => ({ id: req.id, method: req.method, url: req.url }) },
          },
        }),
        NodeIdempotencyModule.forRootAsync({
          storage: { adapter: StorageAdapterEnum.redis, options: { url: redisUrl } },
          cacheTTLMS: 86_400_000,
        }),
      ],
      controllers: [SummariesController],
      providers: [BearerGuard],
    }),
  ],
  PeerModule,
);

async function main() {
  const app = await NestFactory.create(PeerModule, { bufferLogs: true });
  app.useLogger(app.get(Logger));
  app.disable('x-powered-by');
  app.use(metrics);
  app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true, transform: true }));
  app.enableShutdownHooks();
  await app.listen(port, '127.0.0.1');
  process.stderr.write(`peer listening on ${port}\n`);
}

main().catch((err) => {
  process.stderr.write(`peer: failed to start: ${err && err.stack}\n`);
  process.exit(1);
});
