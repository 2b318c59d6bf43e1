import { DynamicModule, Module } from '@nestjs/common';
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
}

@Module({})
export class LlmModule {
  static forRoot(options: LlmModuleOptions): DynamicModule {
    return {
      module: LlmModule,
      providers: [
        {
          provide: LlmClient,
          useFactory: (): LlmClient =>
            options.provider === 'openai'
              ? new OpenAiLlmClient({
                  apiKey: options.apiKey ?? '',
                  baseUrl: options.baseUrl,
                  model: options.model,
                  // A backstop only: RetryPolicy's wall clock cuts first.
                  requestTimeoutMs: options.callTimeoutMs + 1000,
                })
              : new FakeLlmClient(),
        },
      ],
      exports: [LlmClient],
    };
  }
}
