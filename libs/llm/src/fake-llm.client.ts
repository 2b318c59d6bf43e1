import { setTimeout as delay } from 'node:timers/promises';
import type { ChatCompletion } from 'openai/resources/chat/completions';
import type { ChatOptions, ChatRequest, LlmClient, SummarizeOptions } from './llm-client.interface';
import { sanitizeSummary } from './summary.sanitizer';

/**
 * For the quick start without an API key: a deterministic "summary" (the
 * first sentence, at most 200 characters) after a short pause that stands in
 * for the model's latency.
 */
export class FakeLlmClient implements LlmClient {
  readonly defaultModel = 'fake';

  constructor(private readonly latencyMs = 50) {}

  async summarize(text: string, { signal }: SummarizeOptions): Promise<string> {
    await this.pause(signal);
    const first = text.trim().split(/(?<=[.!?])\s/)[0] ?? '';
    // The text is the user's, and may hold a NUL as well as a model's answer can.
    return sanitizeSummary(`Summary: ${first.length > 200 ? `${first.slice(0, 197)}...` : first}`);
  }

  /** Answers with the last user message's first sentence, as summarize does, in a chat completion's shape. */
  async chat(request: ChatRequest, { signal }: ChatOptions): Promise<ChatCompletion> {
    await this.pause(signal);
    const last = [...request.messages].reverse().find((m) => m.role === 'user');
    const text = typeof last?.content === 'string' ? last.content : '';
    const first = text.trim().split(/(?<=[.!?])\s/)[0] ?? '';
    const content = first.length > 200 ? `${first.slice(0, 197)}...` : first;
    return {
      id: `chatcmpl-fake-${Date.now().toString(36)}`,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: request.model ?? 'fake',
      choices: [
        { index: 0, finish_reason: 'stop', logprobs: null, message: { role: 'assistant', content, refusal: null } },
      ],
    };
  }

  private async pause(signal: AbortSignal): Promise<void> {
    try {
      // Its abort listener goes when the pause ends, not with the signal.
      await delay(this.latencyMs, undefined, { signal });
    } catch (err) {
      throw signal.aborted ? signal.reason : err;
    }
  }
}
