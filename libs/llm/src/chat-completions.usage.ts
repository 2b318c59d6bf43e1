import { sseDataOf } from './sse-event.splitter';

export interface TokenUsage {
  readonly prompt_tokens: number;
  readonly completion_tokens: number;
}

/** `"usage":{` as OpenAI writes it, compact in a stream or pretty-printed in a whole answer. */
const HAS_USAGE = /"usage"\s*:\s*\{/;

/**
 * The token counts of a chat completion: a whole JSON answer, or one SSE
 * event of a stream (the last chunk carries them when the request set
 * `stream_options.include_usage`). Only a text that contains `"usage":{` is
 * parsed, so the many chunks without counts cost one regular-expression test.
 * Undefined when there are none, or they are not non-negative integers.
 */
export function usageOf(eventOrJsonBody: string): TokenUsage | undefined {
  if (!HAS_USAGE.test(eventOrJsonBody)) return undefined;
  const json = /^\s*\{/.test(eventOrJsonBody) ? eventOrJsonBody : sseDataOf(eventOrJsonBody);
  if (json === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    return undefined;
  }
  const usage = (parsed as { usage?: unknown } | null)?.usage as
    { prompt_tokens?: unknown; completion_tokens?: unknown } | null | undefined;
  const prompt = usage?.prompt_tokens;
  const completion = usage?.completion_tokens;
  if (!isCount(prompt) || !isCount(completion)) return undefined;
  return { prompt_tokens: prompt, completion_tokens: completion };
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}
