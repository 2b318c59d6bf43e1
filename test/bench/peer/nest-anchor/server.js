'use strict';
/*
 * The anchors of test/bench/api-side-by-side.bench.ts: POST /v1/summaries as
 * a team writes it without us, on Nest 12 (the root's @nestjs/* and ioredis
 * versions, pinned in this folder's lockfile), plain JavaScript so it needs
 * no compiler.
 *
 * - "bare" (PEER_IDEMPOTENCY unset): a guard that looks the Bearer key up in
 *   API_KEYS, hand-written checks of `text` and `notify` (no
 *   class-validator), one XADD to {summaries}:jobs with job_id, tenant and
 *   payload, and the 202 with Location. Nest's default JSON body parser, no
 *   logging, no metrics.
 * - "peer" (PEER_IDEMPOTENCY=1): the same app with @node-idempotency/nestjs
 *   1.0.4 and its Redis storage adapter, configured as its README says: the
 *   key required, at most 128 characters, records kept 24 h. Its peer range
 *   asks for Nest 9 or 10; this folder's `overrides` give it the root's 12,
 *   on which it runs unchanged.
 *
 * Configuration: PORT, REDIS_URL, API_KEYS (`tenant:key,...`). Prints
 * `anchor listening on <port>` on stderr when ready.
 */
require('reflect-metadata');
const {
  BadRequestException,
  Body,
  Controller,
  HttpCode,
  Injectable,
  Module,
  Post,
  Req,
  Res,
  UnauthorizedException,
  UseGuards,
} = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { Redis } = require('ioredis');
const { randomUUID } = require('node:crypto');

const port = Number(process.env.PORT ?? 3000);
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withPeer = process.env.PEER_IDEMPOTENCY === '1';
const tenants = new Map(
  (process.env.API_KEYS ?? 'demo:demo-key').split(',').map((entry) => {
    const [tenant, key] = entry.split(':');
    return [key, tenant];
  }),
);

const decorate = (decorators, target, key, desc) => Reflect.decorate(decorators, target, key, desc);

class BearerGuard {
  canActivate(context) {
    const req = context.switchToHttp().getRequest();
    const header = req.headers.authorization;
    const tenant = typeof header === 'string' && header.startsWith('Bearer ') ? tenants.get(header.slice(7)) : undefined;
    if (tenant === undefined) throw new UnauthorizedException('Send Authorization: Bearer <api key>.');
    req.tenant = tenant;
    return true;
  }
}
decorate([Injectable()], BearerGuard);

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;
function check(body) {
  const text = body && body.text;
  const notify = body && body.notify;
  if (typeof text !== 'string' || text.length < 1 || text.length > 100_000 || !/\S/.test(text)) {
    throw new BadRequestException('text must be a string of 1 to 100000 characters, not only whitespace');
  }
  if (typeof notify !== 'string' || notify.length > 254 || !EMAIL.test(notify)) {
    throw new BadRequestException('notify must be an email address');
  }
  return { text, notify };
}

const redis = new Redis(redisUrl, { connectionName: withPeer ? 'peer' : 'bare', maxRetriesPerRequest: 1 });

class SummariesController {
  async create(body, req, res) {
    const payload = check(body);
    const jobId = randomUUID();
    await redis.xadd('{summaries}:jobs', '*', 'job_id', jobId, 'tenant', req.tenant, 'payload', JSON.stringify(payload));
    res.location(`/v1/summaries/${jobId}`);
    return { job_id: jobId, status: 'queued' };
  }
}
Reflect.defineMetadata('design:paramtypes', [Object, Object, Object], SummariesController.prototype, 'create');
Body()(SummariesController.prototype, 'create', 0);
Req()(SummariesController.prototype, 'create', 1);
Res({ passthrough: true })(SummariesController.prototype, 'create', 2);

const imports = [];
const routeDecorators = [Post(), HttpCode(202)];
if (withPeer) {
  const { NodeIdempotencyModule, Idempotent } = require('@node-idempotency/nestjs');
  const { StorageAdapterEnum } = require('@node-idempotency/shared');
  imports.push(
    NodeIdempotencyModule.forRootAsync({
      storage: { adapter: StorageAdapterEnum.redis, options: { url: redisUrl } },
      enforceIdempotency: true,
      keyMaxLength: 128,
      cacheTTLMS: 24 * 3600 * 1000,
    }),
  );
  routeDecorators.push(Idempotent());
}
decorate(
  routeDecorators,
  SummariesController.prototype,
  'create',
  Object.getOwnPropertyDescriptor(SummariesController.prototype, 'create'),
);
decorate([Controller('v1/summaries'), UseGuards(BearerGuard)], SummariesController);

class AnchorModule {}
decorate([Module({ imports, controllers: [SummariesController], providers: [BearerGuard] })], AnchorModule);

async function main() {
  const app = await NestFactory.create(AnchorModule, { logger: false });
  app.enableShutdownHooks();
  await app.listen(port, '127.0.0.1');
  process.stderr.write(`anchor listening on ${port}\n`);
}

main().catch((err) => {
  process.stderr.write(`anchor: failed to start: ${err && err.stack}\n`);
  process.exit(1);
});
