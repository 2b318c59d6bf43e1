import { DynamicModule, Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { FakeLlmClient } from './fake-llm.client';
import { LlmClient } from './llm-client.interface';
import type { LlmProvider } from './llm-provider.settings';
import { OpenAiLlmClient } from './openai-llm.client';

export interface LlmModuleOptions {
  readonly provider: LlmProvider;
  readonly apiKey?: string;
  readonly baseUrl?: string;
  readonly model: string;
  readonly callTimeoutMs: number;
  /**
   * Gateway mode (LLM_GATEWAY_URL, the api's base URL, with INTERNAL_API_KEY): every call goes
   * to the api's gateway with the internal key, naming its tenant, whatever
   * `provider` says; the api holds the provider's credentials. What it buys:
   * the gateway records each keyed call, so a call whose worker died is
   * answered from the record (or attached to the running call) on retry.
   */
  readonly gatewayUrl?: string;
  /** The key gateway mode authenticates with; both this and `gatewayUrl`, or neither. */
  readonly internalApiKey?: string;
}

/**
 * The client forRoot builds: the gateway, the provider directly, or the
 * built-in fake. One of `gatewayUrl` and `internalApiKey` without the other
 * throws: the config refuses that at boot, and a caller that got here
 * otherwise would silently call the provider directly.
 */
export function llmClientFor(options: LlmModuleOptions): LlmClient {
  // A backstop only: RetryPolicy's wall clock cuts first.
  const requestTimeoutMs = options.callTimeoutMs + 1000;
  if ((options.gatewayUrl === undefined) !== (options.internalApiKey === undefined))
    throw new Error('LlmModule: gateway mode needs both gatewayUrl and internalApiKey, or neither');
  if (options.gatewayUrl !== undefined && options.internalApiKey !== undefined)
    return new OpenAiLlmClient({
      apiKey: options.internalApiKey,
      // The config gives the URL's origin (LLM_GATEWAY_URL is the api's base URL, nothing else).
      baseUrl: `${options.gatewayUrl}/v1`,
      model: options.model,
      requestTimeoutMs,
      sendTenant: true,
    });
  if (options.provider === 'openai')
    return new OpenAiLlmClient({
      apiKey: options.apiKey ?? '',
      baseUrl: options.baseUrl,
      model: options.model,
      requestTimeoutMs,
    });
  return new FakeLlmClient();
}

@Module({})
export class LlmModule implements OnApplicationShutdown {
  constructor(@Inject(LlmClient) private readonly client: LlmClient) {}

  /** The client's kept-alive connections end with the app (idle ones would not hold the process, but would linger). */
  onApplicationShutdown(): void {
    if (this.client instanceof OpenAiLlmClient) this.client.close();
  }

  static forRoot(options: LlmModuleOptions): DynamicModule {
    return {
      module: LlmModule,
      providers: [{ provide: LlmClient, useFactory: (): LlmClient => llmClientFor(options) }],
      exports: [LlmClient],
    };
  }
}
