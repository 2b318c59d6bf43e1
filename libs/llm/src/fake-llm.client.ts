import { setTimeout as delay } from 'node:timers/promises';
import type { LlmClient, SummarizeOptions } from './llm-client.interface';
import { sanitizeSummary } from './summary.sanitizer';

/**
 * For the quick start without an API key: a deterministic "summary" (the
 * first sentence, at most 200 characters) after a short pause that stands in
 * for the model's latency.
 */
export class FakeLlmClient implements LlmClient {
  constructor(private readonly latencyMs = 50) {}

  async summarize(text: string, { signal }: SummarizeOptions): Promise<string> {
    try {
      // Its abort listener goes when the pause ends, not with the signal.
      await delay(this.latencyMs, undefined, { signal });
    } catch (err) {
      throw signal.aborted ? signal.reason : err;
    }
    const first = text.trim().split(/(?<=[.!?])\s/)[0] ?? '';
    // The text is the user's, and may hold a NUL as well as a model's answer can.
    return sanitizeSummary(`Summary: ${first.length > 200 ? `${first.slice(0, 197)}...` : first}`);
  }
}
