import { sseDataOf } from './sse-event.splitter';

/**
 * What one event of a Responses API stream means to the gateway:
 * - `more`: an event on the way (a delta, a part added), or a comment;
 * - `terminal`: `response.completed` or `response.incomplete`: the answer is
 *   whole once the provider closes the stream after it;
 * - `failed`: `response.failed` or `error`: the call produced no answer to keep;
 * - `malformed`: data that is not a JSON object with a string `type`: not what
 *   the API promises, so the stream is not kept either.
 */
export type ResponsesEventKind = 'more' | 'terminal' | 'failed' | 'malformed';

export interface ResponsesEvent {
  readonly kind: ResponsesEventKind;
  /** The event's `type` (data's own, else the `event:` field's). */
  readonly type?: string;
  /** Its `sequence_number`, when it has one (every event OpenAI sends does). */
  readonly sequenceNumber?: number;
  /** The id of the response it carries (`response.created` and the terminal events carry the whole response). */
  readonly responseId?: string;
}

const TERMINAL = new Set(['response.completed', 'response.incomplete']);
const FAILED = new Set(['response.failed', 'error']);
const MORE: ResponsesEvent = { kind: 'more' };
const MALFORMED: ResponsesEvent = { kind: 'malformed' };

/** The value of one named field of an event (`event:`, `id:`), the last if it repeats. */
function sseFieldOf(event: string, name: string): string | undefined {
  let value: string | undefined;
  for (const line of event.split(/\r\n|\r|\n/)) {
    if (line.startsWith(`${name}:`)) value = line.slice(name.length + 1).replace(/^ /, '');
  }
  return value;
}

/**
 * Reads one event of a Responses API stream (its exact text, as the splitter
 * gives it). Every event with data is parsed: the type decides whether the
 * stream is whole, and its sequence number is what a resumed stream starts
 * after. An event without data (a comment, a blank line) is `more`.
 */
export function responsesEventOf(event: string): ResponsesEvent {
  const data = sseDataOf(event);
  if (data === undefined) return MORE;
  let parsed: unknown;
  try {
    parsed = JSON.parse(data);
  } catch {
    return MALFORMED;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return MALFORMED;
  const fields = parsed as { type?: unknown; sequence_number?: unknown; response?: { id?: unknown } | null };
  const type = typeof fields.type === 'string' ? fields.type : sseFieldOf(event, 'event');
  if (type === undefined) return MALFORMED;
  const sequenceNumber =
    typeof fields.sequence_number === 'number' && Number.isSafeInteger(fields.sequence_number)
      ? fields.sequence_number
      : undefined;
  const kind: ResponsesEventKind = TERMINAL.has(type) ? 'terminal' : FAILED.has(type) ? 'failed' : 'more';
  const responseId = typeof fields.response?.id === 'string' ? fields.response.id : undefined;
  return {
    kind,
    type,
    ...(sequenceNumber === undefined ? {} : { sequenceNumber }),
    ...(responseId === undefined ? {} : { responseId }),
  };
}
