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

/** One event grew past the cap: the stream is treated as broken, not buffered on. */
export class SseEventTooLargeError extends Error {
  constructor(readonly maxEventBytes: number) {
    super(`an event of the stream is larger than ${maxEventBytes} bytes`);
    this.name = 'SseEventTooLargeError';
  }
}

export interface SseSplitOptions {
  /** The most bytes one event may take, its blank line included; past it the iteration throws SseEventTooLargeError. */
  readonly maxEventBytes?: number;
}

function indexOrEnd(chunk: Buffer, byte: number, from: number): number {
  const at = chunk.indexOf(byte, from);
  return at === -1 ? chunk.length : at;
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
 * is thrown as it is, after the events that were complete before it. An event
 * past `maxEventBytes` throws SseEventTooLargeError as soon as it is.
 *
 * Each byte is looked at once: the chunks of an event still open are kept as
 * they came and joined only when it ends (joining at every chunk made a long
 * line quadratic: 30 MB without a line break held the event loop for seconds),
 * and the line breaks are found with indexOf, not byte by byte in JS.
 *
 * An event within one chunk is a view into it (Buffer.from() copies it).
 */
export async function* sseEventBuffers(
  body: AsyncIterable<Buffer>,
  options: SseSplitOptions = {},
): AsyncGenerator<Buffer, void, undefined> {
  const maxEventBytes = options.maxEventBytes ?? Number.POSITIVE_INFINITY;
  // The open event's bytes from earlier chunks.
  let parts: Buffer[] = [];
  let partsBytes = 0;
  // Across chunks: at the start of a line; the last byte was a CR; a blank
  // line ending in CR has ended the event, which takes one more LF if it comes.
  let atLineStart = true;
  let afterCr = false;
  let endAfterCr = false;

  const take = (chunk: Buffer, start: number, end: number): Buffer => {
    const tail = chunk.subarray(start, end);
    const event = parts.length === 0 ? tail : Buffer.concat([...parts, tail], partsBytes + tail.length);
    parts = [];
    partsBytes = 0;
    if (event.length > maxEventBytes) throw new SseEventTooLargeError(maxEventBytes);
    return event;
  };

  for await (const chunk of body) {
    const n = chunk.length;
    let start = 0;
    // The next CR and LF at or after i (n when there is none), found once each.
    let nextCr = -1;
    let nextLf = -1;
    let i = 0;
    while (i < n) {
      const byte = chunk[i];
      if (afterCr) {
        afterCr = false;
        if (byte === LF) {
          if (endAfterCr) {
            endAfterCr = false;
            yield take(chunk, start, i + 1);
            start = i + 1;
          }
          i++;
          continue;
        }
      }
      if (endAfterCr) {
        endAfterCr = false;
        yield take(chunk, start, i);
        start = i;
      }
      if (byte === LF || byte === CR) {
        if (atLineStart) {
          if (byte === CR) {
            endAfterCr = true;
          } else {
            yield take(chunk, start, i + 1);
            start = i + 1;
          }
        }
        atLineStart = true;
        afterCr = byte === CR;
        i++;
        continue;
      }
      // Inside a line: on to its end.
      atLineStart = false;
      if (nextCr < i) nextCr = indexOrEnd(chunk, CR, i);
      if (nextLf < i) nextLf = indexOrEnd(chunk, LF, i);
      i = Math.min(nextCr, nextLf);
    }
    if (start < n) {
      parts.push(start === 0 ? chunk : chunk.subarray(start));
      partsBytes += n - start;
      if (partsBytes > maxEventBytes) throw new SseEventTooLargeError(maxEventBytes);
    }
  }

  if (parts.length === 0) return;
  const rest = parts.length === 1 ? parts[0] : Buffer.concat(parts, partsBytes);
  if (endAfterCr) yield rest;
  else throw new IncompleteSseEventError(rest);
}

/** sseEventBuffers() as text (an event never ends inside a UTF-8 character). */
export async function* sseEvents(
  body: AsyncIterable<Buffer>,
  options: SseSplitOptions = {},
): AsyncGenerator<string, void, undefined> {
  for await (const event of sseEventBuffers(body, options)) yield event.toString('utf8');
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
