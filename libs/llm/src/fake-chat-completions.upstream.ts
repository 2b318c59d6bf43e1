import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import {
  abortedBeforeHead,
  type ChatCompletionsUpstream,
  type UpstreamRequest,
  type UpstreamResponse,
} from './chat-completions.upstream';
import { responseBody, responseEvents, type ResponseAnswer, responsesUserText } from './responses-wire';

export interface FakeChatCompletionsUpstreamOptions {
  /** Before the response head: the model's time to its first token. Default 0. */
  readonly firstByteMs?: number;
  /** Between two chunks of a stream. Default 0. */
  readonly chunkMs?: number;
}

type FinishReason = 'stop' | 'length';

interface Answer {
  /** The answer's words, each with the whitespace before it: joined, they are the content. */
  readonly pieces: readonly string[];
  readonly finishReason: FinishReason;
  readonly promptTokens: number;
}

/**
 * The built-in model (LLM_PROVIDER=fake), so the quick start and the tests run
 * offline: OpenAI's wire format (chat completions and responses), streamed or not, with an answer that follows
 * from the last user message. Requests without a model or messages get
 * OpenAI's 400. Tokens are counted as words.
 */
export class FakeChatCompletionsUpstream implements ChatCompletionsUpstream {
  private readonly firstByteMs: number;
  private readonly chunkMs: number;

  constructor(options: FakeChatCompletionsUpstreamOptions = {}) {
    this.firstByteMs = options.firstByteMs ?? 0;
    this.chunkMs = options.chunkMs ?? 0;
  }

  async send({ method = 'POST', path, json, signal }: UpstreamRequest): Promise<UpstreamResponse> {
    try {
      if (this.firstByteMs > 0) await delay(this.firstByteMs, undefined, { signal });
      signal.throwIfAborted();
    } catch (err) {
      throw signal.aborted ? abortedBeforeHead(signal) : err;
    }
    if (method !== 'POST' || path?.startsWith('responses/')) {
      // It keeps no responses: what the gateway did not record is found nowhere.
      const error = {
        message: 'No response found with that id.',
        type: 'invalid_request_error',
        param: null,
        code: null,
      };
      return { status: 404, headers: jsonHeaders(), body: once(`${JSON.stringify({ error }, null, 2)}\n`, signal) };
    }
    if (path === 'responses') return this.respond(json, signal);
    const invalid = invalidRequest(json);
    if (invalid !== undefined)
      return {
        status: 400,
        headers: jsonHeaders(),
        body: once(`${JSON.stringify({ error: invalid }, null, 2)}\n`, signal),
      };

    const request = json as ChatRequest;
    const answer = answerTo(request);
    const id = `chatcmpl-${randomUUID().replaceAll('-', '')}`;
    const created = Math.floor(Date.now() / 1000);
    const usage = {
      prompt_tokens: answer.promptTokens,
      completion_tokens: answer.pieces.length,
      total_tokens: answer.promptTokens + answer.pieces.length,
    };

    if (request.stream !== true) {
      const completion = {
        id,
        object: 'chat.completion',
        created,
        model: request.model,
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: answer.pieces.join(''), refusal: null },
            logprobs: null,
            finish_reason: answer.finishReason,
          },
        ],
        usage,
      };
      return { status: 200, headers: jsonHeaders(), body: once(`${JSON.stringify(completion, null, 2)}\n`, signal) };
    }

    const includeUsage = request.stream_options?.include_usage === true;
    const chunk = (delta: Record<string, string>, finishReason: FinishReason | null): string =>
      event({
        id,
        object: 'chat.completion.chunk',
        created,
        model: request.model,
        choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
        ...(includeUsage ? { usage: null } : {}),
      });
    const events = [
      chunk({ role: 'assistant', content: '' }, null),
      ...answer.pieces.map((piece) => chunk({ content: piece }, null)),
      chunk({}, answer.finishReason),
      ...(includeUsage
        ? [event({ id, object: 'chat.completion.chunk', created, model: request.model, choices: [], usage })]
        : []),
      'data: [DONE]\n\n',
    ];
    return {
      status: 200,
      headers: { 'content-type': 'text/event-stream; charset=utf-8', 'x-request-id': requestId() },
      body: this.stream(events, signal),
    };
  }

  /** `POST /responses`: the same answer as a response object, or its stream of events. */
  private respond(json: unknown, signal: AbortSignal): UpstreamResponse {
    const body =
      typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as Record<string, unknown>) : {};
    if (typeof body.model !== 'string' || body.model === '') {
      const error = { message: 'you must provide a model parameter', type: 'invalid_request_error', param: 'model' };
      return {
        status: 400,
        headers: jsonHeaders(),
        body: once(`${JSON.stringify({ error: { ...error, code: null } }, null, 2)}\n`, signal),
      };
    }
    const said = Array.from(responsesUserText(body).slice(0, 400)).slice(0, 200).join('');
    let pieces: readonly string[] = `This is the built-in fake model. You wrote: "${said}"`.match(/\s*\S+/g) ?? [];
    const limit = body.max_output_tokens;
    const cut = typeof limit === 'number' && Number.isInteger(limit) && limit > 0 && pieces.length > limit;
    if (cut) pieces = pieces.slice(0, limit);
    const answer: ResponseAnswer = {
      pieces,
      inputTokens: said.match(/\S+/g)?.length ?? 0,
      model: body.model,
      ...(cut ? { incompleteReason: 'max_output_tokens' as const } : {}),
      previousResponseId: typeof body.previous_response_id === 'string' ? body.previous_response_id : null,
      maxOutputTokens: typeof limit === 'number' ? limit : null,
    };
    if (body.stream !== true) return { status: 200, headers: jsonHeaders(), body: once(responseBody(answer), signal) };
    return {
      status: 200,
      headers: { 'content-type': 'text/event-stream; charset=utf-8', 'x-request-id': requestId() },
      body: this.stream(responseEvents(answer), signal),
    };
  }

  private async *stream(events: readonly string[], signal: AbortSignal): AsyncGenerator<Buffer, void, undefined> {
    for (let i = 0; i < events.length; i++) {
      if (i > 0 && this.chunkMs > 0) {
        try {
          await delay(this.chunkMs, undefined, { signal });
        } catch (err) {
          throw signal.aborted ? signal.reason : err;
        }
      }
      signal.throwIfAborted();
      yield Buffer.from(events[i]);
    }
  }
}

interface ChatRequest {
  readonly model: string;
  readonly messages: readonly unknown[];
  readonly stream?: unknown;
  readonly stream_options?: { readonly include_usage?: unknown } | null;
  readonly max_tokens?: unknown;
  readonly max_completion_tokens?: unknown;
}

interface OpenAiError {
  readonly message: string;
  readonly type: 'invalid_request_error';
  readonly param: 'model' | 'messages';
  readonly code: null;
}

/** OpenAI's refusals for a request without its two required parameters. */
function invalidRequest(json: unknown): OpenAiError | undefined {
  const body =
    typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as Record<string, unknown>) : {};
  if (typeof body.model !== 'string' || body.model === '') {
    return { message: 'you must provide a model parameter', type: 'invalid_request_error', param: 'model', code: null };
  }
  if (!Array.isArray(body.messages)) {
    return {
      message: "Missing required parameter: 'messages'.",
      type: 'invalid_request_error',
      param: 'messages',
      code: null,
    };
  }
  if (body.messages.length === 0) {
    return {
      message:
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
      type: 'invalid_request_error',
      param: 'messages',
      code: null,
    };
  }
  return undefined;
}

function answerTo(request: ChatRequest): Answer {
  const lastUser = request.messages.findLast((m) => (m as { role?: unknown } | null)?.role === 'user');
  const said = Array.from(textOf(lastUser).slice(0, 400)).slice(0, 200).join('');
  let pieces: readonly string[] = `This is the built-in fake model. You wrote: "${said}"`.match(/\s*\S+/g) ?? [];
  let finishReason: FinishReason = 'stop';
  const limit = request.max_completion_tokens ?? request.max_tokens;
  if (typeof limit === 'number' && Number.isInteger(limit) && limit > 0 && pieces.length > limit) {
    pieces = pieces.slice(0, limit);
    finishReason = 'length';
  }
  const promptTokens = request.messages.reduce<number>((n, m) => n + (textOf(m).match(/\S+/g)?.length ?? 0), 0);
  return { pieces, finishReason, promptTokens };
}

/** A message's text: its string content, or the text parts of an array content. */
function textOf(message: unknown): string {
  const content = (message as { content?: unknown } | null | undefined)?.content;
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return (content as unknown[])
    .map((part) => part as { type?: unknown; text?: unknown } | null)
    .filter((part) => part?.type === 'text' && typeof part.text === 'string')
    .map((part) => part?.text as string)
    .join(' ');
}

function event(data: unknown): string {
  return `data: ${JSON.stringify(data)}\n\n`;
}

function jsonHeaders(): Record<string, string> {
  return { 'content-type': 'application/json', 'x-request-id': requestId() };
}

function requestId(): string {
  return `req_${randomBytes(16).toString('hex')}`;
}

async function* once(text: string, signal: AbortSignal): AsyncGenerator<Buffer, void, undefined> {
  signal.throwIfAborted();
  yield Buffer.from(text);
}
