import { DynamicModule, MiddlewareConsumer, Module, NestModule } from '@nestjs/common';
import { ChatCompletionsUpstreamModule, type ChatCompletionsUpstreamModuleOptions } from '@app/llm';
import { ChatCompletionsController } from './chat-completions.controller';
import { ChatCompletionsRelay } from './chat-completions.relay';
import { GatewayCalls } from './gateway-calls';
import { GatewayCallsMiddleware } from './gateway-calls.middleware';
import { GatewayMetrics } from './gateway.metrics';
import { GATEWAY_OPTIONS, type GatewayOptions } from './gateway.options';
import { ResponsesController } from './responses.controller';

/** POST /v1/chat/completions and POST /v1/responses: the OpenAI-compatible gateway to the configured provider. */
@Module({})
export class GatewayModule implements NestModule {
  static forRoot(options: GatewayOptions & { readonly provider: ChatCompletionsUpstreamModuleOptions }): DynamicModule {
    return {
      module: GatewayModule,
      imports: [ChatCompletionsUpstreamModule.forRoot(options.provider)],
      controllers: [ChatCompletionsController, ResponsesController],
      providers: [
        {
          provide: GATEWAY_OPTIONS,
          useValue: { timeoutMs: options.timeoutMs, drainMs: options.drainMs, tenants: options.tenants },
        },
        GatewayMetrics,
        GatewayCalls,
        ChatCompletionsRelay,
      ],
    };
  }

  configure(consumer: MiddlewareConsumer): void {
    consumer.apply(GatewayCallsMiddleware).forRoutes(ChatCompletionsController, ResponsesController);
  }
}
