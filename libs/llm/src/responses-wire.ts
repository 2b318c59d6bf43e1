import { randomBytes } from 'node:crypto';

/** What a fake model answers through the Responses API: the text's pieces (each a delta) and its counts. */
export interface ResponseAnswer {
  /** The text in the pieces it is streamed in; joined, they are the whole text. */
  readonly pieces: readonly string[];
  readonly inputTokens: number;
  /** Set when the answer was cut short: `response.incomplete` with this reason. */
  readonly incompleteReason?: 'max_output_tokens';
  readonly model: string;
  /** Echoed as the request gave them. */
  readonly previousResponseId?: string | null;
  readonly maxOutputTokens?: number | null;
}

/** An id as OpenAI writes them: a prefix, then 48 hex digits. */
export function responsesId(prefix: 'resp' | 'msg'): string {
  return `${prefix}_${randomBytes(24).toString('hex')}`;
}

/** A Responses API response object for an answer, in the state given, with the fields the SDKs read. */
function responseObject(
  answer: ResponseAnswer,
  ids: { readonly response: string; readonly message: string },
  createdAt: number,
  state: 'in_progress' | 'done',
): Record<string, unknown> {
  const text = answer.pieces.join('');
  const status = state === 'in_progress' ? 'in_progress' : answer.incompleteReason ? 'incomplete' : 'completed';
  return {
    id: ids.response,
    object: 'response',
    created_at: createdAt,
    status,
    background: false,
    error: null,
    incomplete_details: state === 'done' && answer.incompleteReason ? { reason: answer.incompleteReason } : null,
    instructions: null,
    max_output_tokens: answer.maxOutputTokens ?? null,
    model: answer.model,
    output:
      state === 'in_progress'
        ? []
        : [
            {
              id: ids.message,
              type: 'message',
              status: answer.incompleteReason ? 'incomplete' : 'completed',
              role: 'assistant',
              content: [{ type: 'output_text', text, annotations: [], logprobs: [] }],
            },
          ],
    parallel_tool_calls: true,
    previous_response_id: answer.previousResponseId ?? null,
    reasoning: { effort: null, summary: null },
    store: true,
    temperature: 1,
    text: { format: { type: 'text' } },
    tool_choice: 'auto',
    tools: [],
    top_p: 1,
    truncation: 'disabled',
    usage:
      state === 'in_progress'
        ? null
        : {
            input_tokens: answer.inputTokens,
            input_tokens_details: { cached_tokens: 0 },
            output_tokens: answer.pieces.length,
            output_tokens_details: { reasoning_tokens: 0 },
            total_tokens: answer.inputTokens + answer.pieces.length,
          },
    user: null,
    metadata: {},
  };
}

/** The whole (non-stream) answer: the response object, pretty-printed as OpenAI sends it. */
export function responseBody(answer: ResponseAnswer, responseId = responsesId('resp')): string {
  const ids = { response: responseId, message: responsesId('msg') };
  return `${JSON.stringify(responseObject(answer, ids, Math.floor(Date.now() / 1000), 'done'), null, 2)}\n`;
}

/**
 * The answer as a Responses API stream, event by event as OpenAI writes them
 * (`event:` and `data:` lines, a `sequence_number` from 0): created, in
 * progress, the message and its text part added, one delta per piece, the
 * text, part and item done, then `response.completed` (or
 * `response.incomplete`) with the whole response and its usage.
 */
export function responseEvents(answer: ResponseAnswer, responseId = responsesId('resp')): string[] {
  const ids = { response: responseId, message: responsesId('msg') };
  const createdAt = Math.floor(Date.now() / 1000);
  const text = answer.pieces.join('');
  const part = { type: 'output_text', text, annotations: [], logprobs: [] };
  const at = { item_id: ids.message, output_index: 0, content_index: 0 };
  const done = responseObject(answer, ids, createdAt, 'done');
  const item = (done.output as unknown[])[0];
  const bodies: Record<string, unknown>[] = [
    { type: 'response.created', response: responseObject(answer, ids, createdAt, 'in_progress') },
    { type: 'response.in_progress', response: responseObject(answer, ids, createdAt, 'in_progress') },
    {
      type: 'response.output_item.added',
      output_index: 0,
      item: { id: ids.message, type: 'message', status: 'in_progress', role: 'assistant', content: [] },
    },
    { type: 'response.content_part.added', ...at, part: { ...part, text: '' } },
    ...answer.pieces.map((delta) => ({ type: 'response.output_text.delta', ...at, delta, logprobs: [] })),
    { type: 'response.output_text.done', ...at, text, logprobs: [] },
    { type: 'response.content_part.done', ...at, part },
    { type: 'response.output_item.done', output_index: 0, item },
    { type: answer.incompleteReason ? 'response.incomplete' : 'response.completed', response: done },
  ];
  return bodies.map(
    (body, n) => `event: ${String(body.type)}\ndata: ${JSON.stringify({ ...body, sequence_number: n })}\n\n`,
  );
}

/**
 * The text of a Responses request's last user input: `input` as a string,
 * or the last item with role `user` (its string content, or its
 * `input_text` parts).
 */
export function responsesUserText(body: unknown): string {
  const input = (body as { input?: unknown } | null)?.input;
  if (typeof input === 'string') return input;
  if (!Array.isArray(input)) return '';
  const last = (input as unknown[]).findLast((item) => (item as { role?: unknown } | null)?.role === 'user') as
    { content?: unknown } | undefined;
  const content = last?.content;
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return (content as { type?: unknown; text?: unknown }[])
    .filter((p) => (p?.type === 'input_text' || p?.type === 'text') && typeof p.text === 'string')
    .map((p) => p.text as string)
    .join(' ');
}
