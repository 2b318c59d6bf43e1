import {
  DynamicModule,
  Inject,
  MiddlewareConsumer,
  Module,
  NestModule,
  RequestMethod,
  type OnApplicationShutdown,
} from '@nestjs/common';
import type { ChatCompletionsUpstreamModuleOptions } from '@app/llm';
import { type Durability, REDIS_CLIENT, REDIS_DURABILITY, type RedisClient } from '@app/redis';
import { DataSource } from 'typeorm';
import { ChatCompletionsController } from './chat-completions.controller';
import { ChatCompletionsRelay } from './chat-completions.relay';
import { GatewayCalls } from './gateway-calls';
import { GatewayCallsMiddleware } from './gateway-calls.middleware';
import { GatewayFastPath } from './gateway-fast-path';
import { GatewayMetrics } from './gateway.metrics';
import { GATEWAY_OPTIONS, type GatewayOptions } from './gateway.options';
import { type GatewayUpstreamConfig, GatewayUpstreams } from './gateway-upstreams';
import { RESPONSES_PATH, ResponsesController } from './responses.controller';
import { ResponsesLookup } from './responses-lookup';
import { type TenantTokenLimits, TenantTokenLimiter } from '@app/llm';

/** A token reservation's lease past GATEWAY_TIMEOUT_S: the call has ended by then, whatever became of its holder. */
const TOKEN_LEASE_MARGIN_MS = 5000;
import { GATEWAY_RECORDS, PostgresGatewayRecords, RedisGatewayRecords } from './gateway-records';

export interface GatewayModuleOptions extends GatewayOptions {
  /** LLM_PROVIDER / OPENAI_*: the one upstream when GATEWAY_UPSTREAMS is unset. */
  readonly provider: ChatCompletionsUpstreamModuleOptions;
  /** GATEWAY_UPSTREAMS, parsed; undefined when unset. */
  readonly upstreams?: readonly GatewayUpstreamConfig[];
  /** TENANT_TOKEN_LIMITS, parsed; undefined when unset. */
  readonly tokenLimits?: TenantTokenLimits;
  /** IDEMPOTENCY_STORE: where the gateway's own records (GatewayRecords) live, beside the idempotency records. */
  readonly store: 'redis' | 'postgres';
}

/**
 * POST /v1/chat/completions and POST /v1/responses: the OpenAI-compatible
 * gateway to the configured upstreams. Their kept-alive connections are
 * closed at application shutdown, after the HTTP server has finished its
 * requests (and so the streams it was relaying).
 */
@Module({})
export class GatewayModule implements NestModule, OnApplicationShutdown {
  constructor(@Inject(GatewayUpstreams) private readonly upstreams: GatewayUpstreams) {}

  static forRoot(options: GatewayModuleOptions): DynamicModule {
    const gatewayOptions: GatewayOptions = {
      timeoutMs: options.timeoutMs,
      drainMs: options.drainMs,
      tenants: options.tenants,
      recordTtlMs: options.recordTtlMs,
    };
    return {
      module: GatewayModule,
      controllers: [ChatCompletionsController, ResponsesController],
      providers: [
        { provide: GATEWAY_OPTIONS, useValue: gatewayOptions },
        { provide: GatewayUpstreams, useFactory: () => GatewayUpstreams.create(options.upstreams, options.provider) },
        {
          provide: GATEWAY_RECORDS,
          inject: [REDIS_CLIENT, { token: REDIS_DURABILITY, optional: true }, DataSource],
          useFactory: (redis: RedisClient, durability: Durability | undefined, dataSource: DataSource) =>
            options.store === 'postgres'
              ? new PostgresGatewayRecords(dataSource)
              : new RedisGatewayRecords(redis, durability),
        },
        {
          provide: TenantTokenLimiter,
          inject: [REDIS_CLIENT],
          // A reservation outlives the longest call (GATEWAY_TIMEOUT_S) by a little: a holder that died frees it then.
          useFactory: (redis: RedisClient) =>
            new TenantTokenLimiter(redis, options.tokenLimits, options.timeoutMs + TOKEN_LEASE_MARGIN_MS),
        },
        GatewayMetrics,
        GatewayCalls,
        GatewayFastPath,
        ChatCompletionsRelay,
        ResponsesLookup,
      ],
      exports: [GatewayFastPath],
    };
  }

  configure(consumer: MiddlewareConsumer): void {
    // The calls that make completions; a response's own routes (GET, cancel, DELETE) are no such call.
    consumer
      .apply(GatewayCallsMiddleware)
      .forRoutes(ChatCompletionsController, { path: RESPONSES_PATH, method: RequestMethod.POST });
  }

  onApplicationShutdown(): void {
    this.upstreams.close();
  }
}
