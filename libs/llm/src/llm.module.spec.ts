import { FakeLlmClient } from './fake-llm.client';
import { llmClientFor } from './llm.module';
import { OpenAiLlmClient } from './openai-llm.client';

const base = { provider: 'fake' as const, model: 'gpt-test', callTimeoutMs: 1000 };

describe('llmClientFor', () => {
  it('builds the gateway client with both gatewayUrl and internalApiKey, whatever the provider', () => {
    expect(
      llmClientFor({ ...base, gatewayUrl: 'http://api:3000', internalApiKey: 'internal-0123456789' }),
    ).toBeInstanceOf(OpenAiLlmClient);
    expect(llmClientFor(base)).toBeInstanceOf(FakeLlmClient);
  });

  it('refuses one of gatewayUrl and internalApiKey without the other, rather than calling the provider directly', () => {
    expect(() => llmClientFor({ ...base, gatewayUrl: 'http://api:3000' })).toThrow(
      /both gatewayUrl and internalApiKey/,
    );
    expect(() => llmClientFor({ ...base, internalApiKey: 'internal-0123456789' })).toThrow(
      /both gatewayUrl and internalApiKey/,
    );
  });
});
