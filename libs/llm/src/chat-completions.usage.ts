import { sseDataOf } from './sse-event.splitter';

export interface TokenUsage {
  readonly prompt_tokens: number;
  readonly completion_tokens: number;
}

/** `"usage":{` as OpenAI writes it, compact in a stream or pretty-printed in a whole answer. */
const HAS_USAGE = /"usage"\s*:\s*\{/;

/**
 * The token counts of a chat completion or a response: a whole JSON answer,
 * or one SSE event of a stream (a chat stream's last chunk carries them when
 * the request set `stream_options.include_usage`; a responses stream's
 * terminal event always does). Only a text that contains `"usage":{` is
 * parsed, so the many chunks without counts cost one regular-expression test.
 * Undefined when there are none, or they are not non-negative integers.
 */
export function usageOf(eventOrJsonBody: string): TokenUsage | undefined {
  if (!mayHoldUsage(eventOrJsonBody)) return undefined;
  const json = /^\s*\{/.test(eventOrJsonBody) ? eventOrJsonBody : sseDataOf(eventOrJsonBody);
  if (json === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    return undefined;
  }
  return usageIn(parsed);
}

/** Whether the text has `"usage":{` in it: without it, usageOf is undefined and nothing needs parsing. */
export function mayHoldUsage(text: string): boolean {
  return HAS_USAGE.test(text);
}

/** usageOf, for a chat completion or a response (or a stream's event) already parsed. */
export function usageIn(parsed: unknown): TokenUsage | undefined {
  // Chat completions: `usage` with prompt/completion tokens. Responses: `usage` with input/output tokens, on the
  // response object, or on the `response` of a stream's terminal event.
  const container = parsed as { usage?: unknown; response?: { usage?: unknown } | null } | null;
  const usage = (container?.usage ?? container?.response?.usage) as Record<string, unknown> | null | undefined;
  const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
  const completion = usage?.completion_tokens ?? usage?.output_tokens;
  if (!isCount(prompt) || !isCount(completion)) return undefined;
  return { prompt_tokens: prompt, completion_tokens: completion };
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}
