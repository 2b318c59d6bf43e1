import OpenAI from 'openai';
import type { LlmClient, SummarizeOptions } from './llm-client.interface';
import { EmptyCompletionError } from './llm.errors';

export interface OpenAiLlmOptions {
  readonly apiKey: string;
  readonly baseUrl?: string;
  readonly model: string;
  /** The SDK's own per-request timeout: a backstop behind RetryPolicy's wall-clock limit. */
  readonly requestTimeoutMs: number;
}

const SYSTEM_PROMPT =
  'Summarise the user text in a few sentences of plain prose. Keep names, numbers and dates exact. ' +
  'Do not add anything that is not in the text.';

/**
 * The official SDK with its own retries off (`maxRetries: 0`): RetryPolicy is
 * the one layer that decides about retries, so attempts are counted once.
 */
export class OpenAiLlmClient implements LlmClient {
  private readonly client: OpenAI;

  constructor(private readonly options: OpenAiLlmOptions) {
    this.client = new OpenAI({
      apiKey: options.apiKey,
      ...(options.baseUrl ? { baseURL: options.baseUrl } : {}),
      maxRetries: 0,
      timeout: options.requestTimeoutMs,
    });
  }

  async summarize(text: string, { signal }: SummarizeOptions): Promise<string> {
    const completion = await this.client.chat.completions.create(
      {
        model: this.options.model,
        messages: [
          { role: 'system', content: SYSTEM_PROMPT },
          { role: 'user', content: text },
        ],
      },
      { signal },
    );
    const content = completion.choices[0]?.message?.content;
    if (typeof content !== 'string' || content.trim() === '') throw new EmptyCompletionError();
    return content.trim();
  }
}
