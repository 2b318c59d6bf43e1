import 'reflect-metadata';
import { Body, Controller, HttpCode, HttpStatus, Module, Post, Res, UseGuards } from '@nestjs/common';
import { APP_FILTER, APP_PIPE } from '@nestjs/core';
import { serveHttpApp } from '@app/http';
import { LoggingModule, MetricsModule } from '@app/observability';
import { ProblemDetailsFilter, RequestValidationPipe, serviceUnavailable } from '@app/problem';
import { RedisModule } from '@app/redis';
import { jobIdFor, SummaryJobQueue, SummaryQueueModule } from '@app/summary-queue';
import type { Response } from 'express';
import { randomUUID } from 'node:crypto';
import { loadApiConfig } from '../../../apps/api/src/api.config';
import { ApiKeyGuard } from '../../../apps/api/src/auth/api-key.guard';
import { AuthModule } from '../../../apps/api/src/auth/auth.module';
import { Tenant } from '../../../apps/api/src/auth/principal';
import { createApiApp } from '../../../apps/api/src/create-api-app';
import { CreateSummaryDto } from '../../../apps/api/src/summaries/create-summary.dto';

/*
 * The "plain" side of the api side-by-side bench: POST /v1/summaries as the
 * api serves it, less idempotency. The same configuration (loadApiConfig:
 * PORT, REDIS_URL, LOG_LEVEL, API_KEYS), the same app setup (createApiApp:
 * the JSON body parser with its limits, pino as Nest's logger, the OpenAPI
 * document), the same server (serveHttpApp: its timeouts and limits), the same
 * modules on the path of the request (LoggingModule: pino-http, one line per
 * answer at LOG_LEVEL=info; MetricsModule: the latency histogram of every
 * answer), the same guard (ApiKeyGuard), the same DTO through the same
 * RequestValidationPipe, the same ProblemDetailsFilter, and the same
 * enqueue (SummaryJobQueue.enqueue: one EVALSHA of the job record and the
 * XADD). What it does not have: @Idempotent() and its store (the job id is
 * derived from a random UUID, not the idempotency scope), PostgreSQL (no
 * PersistenceModule, no HealthModule's readiness checks), and the api's other
 * routes (refunds, gateway, admin, GET /v1/summaries/:id).
 */

@Controller('v1/summaries')
@UseGuards(ApiKeyGuard)
class PlainSummariesController {
  constructor(private readonly queue: SummaryJobQueue) {}

  @Post()
  @HttpCode(HttpStatus.ACCEPTED)
  async create(
    @Body() body: CreateSummaryDto,
    @Tenant() tenant: string,
    @Res({ passthrough: true }) res: Response,
  ): Promise<{ job_id: string; status: 'queued' }> {
    const jobId = jobIdFor(randomUUID());
    try {
      await this.queue.enqueue({ jobId, tenant, payload: { text: body.text, notify: body.notify } });
    } catch {
      throw serviceUnavailable('The job could not be queued');
    }
    res.location(`/v1/summaries/${jobId}`);
    return { job_id: jobId, status: 'queued' };
  }
}

@Module({ imports: [SummaryQueueModule], controllers: [PlainSummariesController] })
class PlainSummariesModule {}

serveHttpApp('plain', async () => {
  const config = loadApiConfig();
  const app = await createApiApp({
    module: class PlainModule {},
    imports: [
      LoggingModule.forRoot({ level: config.logLevel, app: 'plain' }),
      MetricsModule,
      RedisModule.forRoot({
        url: config.redisUrl,
        clusterNodes: config.redisClusterNodes,
        connectionName: 'plain',
        isGlobal: true,
      }),
      AuthModule.forRoot(config.apiKeys),
      PlainSummariesModule,
    ],
    providers: [
      { provide: APP_FILTER, useClass: ProblemDetailsFilter },
      { provide: APP_PIPE, useClass: RequestValidationPipe },
    ],
  });
  return { app, port: config.port, http: config };
});
