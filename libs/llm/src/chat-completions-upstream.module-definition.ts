import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { FakeChatCompletionsUpstreamOptions } from './fake-chat-completions.upstream';
import type { LlmProvider } from './llm-provider.settings';

export interface ChatCompletionsUpstreamModuleOptions {
  /** `openai`: the provider over HTTP; `fake`: the built-in model, no network. */
  readonly provider: LlmProvider;
  /** Required for `openai`. */
  readonly apiKey?: string;
  /** The provider's API root (OPENAI_BASE_URL); default https://api.openai.com/v1. */
  readonly baseUrl?: string;
  /** Connections kept open to the provider at most; default 256. */
  readonly maxSockets?: number;
  /** The built-in model's pacing. */
  readonly fake?: FakeChatCompletionsUpstreamOptions;
}

export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: CHAT_COMPLETIONS_UPSTREAM_MODULE_OPTIONS,
  OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<ChatCompletionsUpstreamModuleOptions>({ moduleName: 'ChatCompletionsUpstream' })
  .setClassMethodName('forRoot')
  .build();
