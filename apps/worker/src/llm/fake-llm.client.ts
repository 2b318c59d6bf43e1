import type { LlmClient, SummarizeOptions } from './llm-client.interface';

/**
 * For the quick start without an API key: a deterministic "summary" (the
 * first sentence, at most 200 characters) after a short pause that stands in
 * for the model's latency.
 */
export class FakeLlmClient implements LlmClient {
  constructor(private readonly latencyMs = 50) {}

  async summarize(text: string, { signal }: SummarizeOptions): Promise<string> {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(resolve, this.latencyMs);
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        reject(signal.reason);
      }, { once: true });
    });
    const first = text.trim().split(/(?<=[.!?])\s/)[0] ?? '';
    return `Summary: ${first.length > 200 ? `${first.slice(0, 197)}...` : first}`;
  }
}
