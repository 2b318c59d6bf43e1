import { isDoneEvent, responsesEventOf, sseDataOf, type UpstreamPath } from '@app/llm';

/**
 * Where a stream stands after one of its events:
 * - `more`: more is to come;
 * - `done`: the answer is whole at this event (chat completions' `data: [DONE]`); what follows is not read for it;
 * - `terminal`: the answer is whole once the provider ends the stream cleanly after this event (the Responses
 *   API's `response.completed` or `response.incomplete`);
 * - `failed`: the provider says the call failed (`response.failed`, `error`): relayed, never stored;
 * - `malformed`: not an event of the API: the stream is broken.
 */
export type StreamEventKind = 'more' | 'done' | 'terminal' | 'failed' | 'malformed';

/** What the relay reads of one event: where the stream stands, and the response it names (Responses API). */
export interface StreamEventRead {
  readonly kind: StreamEventKind;
  readonly responseId?: string;
}

/** One of the provider's APIs the gateway relays: its path upstream, and how its streams end. */
export interface GatewayApi {
  readonly path: UpstreamPath;
  /** Reads one event of a stream (its exact text). */
  readonly readEvent: (event: string) => StreamEventRead;
  /** The response id of a whole answer (parsed), for an API whose answers have one to look up later (Responses). */
  readonly responseIdOf?: (answer: object) => string | undefined;
  /** What a stream that ended without its end lacked, for the error its callers get. */
  readonly unfinished: string;
}

const DONE: StreamEventRead = { kind: 'done' };
const MORE: StreamEventRead = { kind: 'more' };

const MALFORMED: StreamEventRead = { kind: 'malformed' };

/**
 * A chat completions event: `data: [DONE]`, or data that is a JSON object
 * (looked at, not parsed: its first byte); a comment or a blank line is more
 * of the stream; data that is neither is not the API's.
 */
function readChatEvent(event: string): StreamEventRead {
  // The common case, without splitting lines: one `data: {...}` line.
  if (event.startsWith('data: {')) return MORE;
  if (isDoneEvent(event)) return DONE;
  const data = sseDataOf(event);
  if (data === undefined) return MORE;
  return data.trimStart().startsWith('{') ? MORE : MALFORMED;
}

/** `POST /v1/chat/completions`: a stream ends with `data: [DONE]`. */
export const CHAT_COMPLETIONS_API: GatewayApi = {
  path: 'chat/completions',
  readEvent: readChatEvent,
  unfinished: 'data: [DONE]',
};

/** `POST /v1/responses`: a stream is whole when the provider closes it after its terminal event. */
export const RESPONSES_API: GatewayApi = {
  path: 'responses',
  readEvent: responsesEventOf,
  responseIdOf: (answer) => {
    const id = (answer as { id?: unknown }).id;
    return typeof id === 'string' ? id : undefined;
  },
  unfinished: 'response.completed or response.incomplete',
};
