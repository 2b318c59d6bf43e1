const LF = 0x0a;
const CR = 0x0d;

/**
 * The stream ended inside an event: bytes after the last blank line. A
 * provider's stream that breaks off mid-event ends this way, as does one that
 * omits the blank line after its last event; either way that event was never
 * complete, and the bytes are kept here, not re-emitted.
 */
export class IncompleteSseEventError extends Error {
  constructor(readonly rest: Buffer) {
    super(`the event stream ended inside an event (${rest.length} bytes after the last blank line)`);
    this.name = 'IncompleteSseEventError';
  }
}

/**
 * Splits a text/event-stream body into its events, each the exact bytes from
 * its first line through the blank line that ends it, so that writing them out
 * in order gives back the body byte for byte. Lines may end in LF, CRLF or CR,
 * and the chunks may be cut anywhere (inside a UTF-8 character, between a CR
 * and its LF): the splitting is done on bytes. A blank line with no event
 * before it (an extra line break between events) comes out as an event of its
 * own, so no byte is lost. Bytes left after the last blank line throw
 * IncompleteSseEventError once the body has ended; an error of the body itself
 * is thrown as it is, after the events that were complete before it.
 *
 * Each event is a view into the chunk it came from (Buffer.from() copies it).
 */
export async function* sseEventBuffers(body: AsyncIterable<Buffer>): AsyncGenerator<Buffer, void, undefined> {
  let pending: Buffer | undefined;
  // Across chunks: at the start of a line; the last byte was a CR; a blank
  // line ending in CR has ended the event, which takes one more LF if it comes.
  let atLineStart = true;
  let afterCr = false;
  let endAfterCr = false;

  for await (const chunk of body) {
    const data = pending === undefined ? chunk : Buffer.concat([pending, chunk]);
    let start = 0;
    for (let i = pending === undefined ? 0 : pending.length; i < data.length; i++) {
      const byte = data[i];
      if (afterCr) {
        afterCr = false;
        if (byte === LF) {
          if (endAfterCr) {
            endAfterCr = false;
            yield data.subarray(start, i + 1);
            start = i + 1;
          }
          continue;
        }
      }
      if (endAfterCr) {
        endAfterCr = false;
        yield data.subarray(start, i);
        start = i;
      }
      if (byte === LF || byte === CR) {
        if (atLineStart) {
          if (byte === CR) {
            endAfterCr = true;
          } else {
            yield data.subarray(start, i + 1);
            start = i + 1;
          }
        }
        atLineStart = true;
        afterCr = byte === CR;
      } else {
        atLineStart = false;
      }
    }
    pending = start < data.length ? data.subarray(start) : undefined;
  }

  if (pending === undefined) return;
  if (endAfterCr) yield pending;
  else throw new IncompleteSseEventError(pending);
}

/** sseEventBuffers() as text (an event never ends inside a UTF-8 character). */
export async function* sseEvents(body: AsyncIterable<Buffer>): AsyncGenerator<string, void, undefined> {
  for await (const event of sseEventBuffers(body)) yield event.toString('utf8');
}

/**
 * The event's data: its `data:` lines' values joined by LF, one space after
 * the colon dropped, as EventSource does; undefined when it has none.
 */
export function sseDataOf(event: string): string | undefined {
  let data: string | undefined;
  const text = event.charCodeAt(0) === 0xfeff ? event.slice(1) : event;
  for (const line of text.split(/\r\n|\r|\n/)) {
    if (line === 'data' || line.startsWith('data:')) {
      const value = line.startsWith('data: ') ? line.slice(6) : line.slice(5);
      data = data === undefined ? value : `${data}\n${value}`;
    }
  }
  return data;
}

/** Whether the event is the end of an OpenAI stream: its data is exactly `[DONE]`. */
export function isDoneEvent(event: string): boolean {
  if (event === 'data: [DONE]\n\n') return true;
  return event.includes('[DONE]') && sseDataOf(event) === '[DONE]';
}
