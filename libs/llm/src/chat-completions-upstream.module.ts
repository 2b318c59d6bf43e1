import { Inject, Module, OnApplicationShutdown } from '@nestjs/common';
import { ChatCompletionsUpstream } from './chat-completions.upstream';
import {
  CHAT_COMPLETIONS_UPSTREAM_MODULE_OPTIONS,
  ConfigurableModuleClass,
  type ChatCompletionsUpstreamModuleOptions,
} from './chat-completions-upstream.module-definition';
import { FakeChatCompletionsUpstream } from './fake-chat-completions.upstream';
import { HttpChatCompletionsUpstream } from './http-chat-completions.upstream';

export function createChatCompletionsUpstream(options: ChatCompletionsUpstreamModuleOptions): ChatCompletionsUpstream {
  if (options.provider === 'fake') return new FakeChatCompletionsUpstream(options.fake);
  if (!options.apiKey) throw new Error('the openai provider needs an API key');
  return new HttpChatCompletionsUpstream({
    apiKey: options.apiKey,
    baseUrl: options.baseUrl,
    maxSockets: options.maxSockets,
  });
}

/**
 * `ChatCompletionsUpstream` for the configured provider. The HTTP upstream's
 * kept-alive connections are closed at application shutdown, after the HTTP
 * server has finished its requests (and so the streams it was relaying).
 */
@Module({
  providers: [
    {
      provide: ChatCompletionsUpstream,
      inject: [CHAT_COMPLETIONS_UPSTREAM_MODULE_OPTIONS],
      useFactory: createChatCompletionsUpstream,
    },
  ],
  exports: [ChatCompletionsUpstream],
})
export class ChatCompletionsUpstreamModule extends ConfigurableModuleClass implements OnApplicationShutdown {
  constructor(@Inject(ChatCompletionsUpstream) private readonly upstream: ChatCompletionsUpstream) {
    super();
  }

  onApplicationShutdown(): void {
    if (this.upstream instanceof HttpChatCompletionsUpstream) this.upstream.close();
  }
}
