import { isDoneEvent, responsesEventOf, type UpstreamPath } from '@app/llm';

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

/** One of the provider's APIs the gateway relays: its path upstream, and how its streams end. */
export interface GatewayApi {
  readonly path: UpstreamPath;
  /** Reads one event of a stream (its exact text). */
  readonly eventKind: (event: string) => StreamEventKind;
  /** What a stream that ended without its end lacked, for the error its callers get. */
  readonly unfinished: string;
}

/** `POST /v1/chat/completions`: a stream ends with `data: [DONE]`. */
export const CHAT_COMPLETIONS_API: GatewayApi = {
  path: 'chat/completions',
  eventKind: (event) => (isDoneEvent(event) ? 'done' : 'more'),
  unfinished: 'data: [DONE]',
};

/** `POST /v1/responses`: a stream is whole when the provider closes it after its terminal event. */
export const RESPONSES_API: GatewayApi = {
  path: 'responses',
  eventKind: (event) => responsesEventOf(event).kind,
  unfinished: 'response.completed or response.incomplete',
};
