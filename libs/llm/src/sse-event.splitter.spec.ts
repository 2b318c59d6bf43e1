import {
  IncompleteSseEventError,
  isDoneEvent,
  sseDataOf,
  sseEventBuffers,
  sseEvents,
  SseEventTooLargeError,
} from './sse-event.splitter';

async function* chunksOf(...chunks: Buffer[]): AsyncGenerator<Buffer> {
  for (const chunk of chunks) yield chunk;
}

async function collect(
  body: AsyncIterable<Buffer>,
  maxEventBytes?: number,
): Promise<{ events: string[]; error?: unknown }> {
  const events: string[] = [];
  try {
    for await (const event of sseEvents(body, { maxEventBytes })) events.push(event);
  } catch (error) {
    return { events, error };
  }
  return { events };
}

/** Every way a stream can end its lines and events, and characters of two, three and four bytes. */
const EVENTS = [
  'data: {"content":"é→🙂"}\n\n',
  'event: message\r\ndata: crlf\r\n\r\n',
  'data: cr one\rdata: cr two\r\r',
  // A CR-ended line, then a blank line ended by CRLF.
  'data: mixed\r\r\n',
  '\n',
  ': a comment\n\n',
  'data\n\n',
  'data: [DONE]\n\n',
];
const SAMPLE = Buffer.from(EVENTS.join(''));

describe('sseEvents', () => {
  it('yields each event whole, in order, as one chunk', async () => {
    await expect(collect(chunksOf(SAMPLE))).resolves.toEqual({ events: EVENTS });
  });

  it('yields the same events whatever byte the chunks are cut at', async () => {
    for (let cut = 0; cut <= SAMPLE.length; cut++) {
      const { events, error } = await collect(chunksOf(SAMPLE.subarray(0, cut), SAMPLE.subarray(cut)));
      expect({ cut, events, error }).toEqual({ cut, events: EVENTS, error: undefined });
    }
  });

  it('yields the same events when cut at any two bytes', async () => {
    for (let a = 0; a <= SAMPLE.length; a++) {
      for (let b = a; b <= SAMPLE.length; b++) {
        const { events } = await collect(chunksOf(SAMPLE.subarray(0, a), SAMPLE.subarray(a, b), SAMPLE.subarray(b)));
        // One expect per pair would make this test slow; a mismatch is reported with its cuts.
        if (JSON.stringify(events) !== JSON.stringify(EVENTS))
          expect({ a, b, events }).toEqual({ a, b, events: EVENTS });
      }
    }
  });

  it('yields the same events one byte at a time', async () => {
    const bytes = [...SAMPLE].map((byte) => Buffer.from([byte]));
    await expect(collect(chunksOf(...bytes))).resolves.toEqual({ events: EVENTS });
  });

  it('gives back the body byte for byte, bytes that are not UTF-8 included', async () => {
    const body = Buffer.concat([Buffer.from('data: '), Buffer.from([0xff, 0xc3]), Buffer.from('\n\ndata: [DONE]\n\n')]);
    const events: Buffer[] = [];
    for await (const event of sseEventBuffers(chunksOf(body.subarray(0, 7), body.subarray(7))))
      events.push(Buffer.from(event));
    expect(events).toHaveLength(2);
    expect(Buffer.concat(events).equals(body)).toBe(true);
  });

  it('waits for the byte after a final CR: it may be the LF of a CRLF', async () => {
    const seen: string[] = [];
    let sent = 0;
    async function* body(): AsyncGenerator<Buffer> {
      sent = 1;
      yield Buffer.from('data: a\r\r');
      sent = 2;
      yield Buffer.from('\ndata: b\n\n');
    }
    for await (const event of sseEvents(body())) seen.push(`${sent}:${event}`);
    expect(seen).toEqual(['2:data: a\r\r\n', '2:data: b\n\n']);
  });

  it('ends with a final CR-ended event at the end of the body', async () => {
    await expect(collect(chunksOf(Buffer.from('data: a\r\r')))).resolves.toEqual({ events: ['data: a\r\r'] });
  });

  it('yields nothing for an empty body', async () => {
    await expect(collect(chunksOf())).resolves.toEqual({ events: [] });
    await expect(collect(chunksOf(Buffer.alloc(0), Buffer.alloc(0)))).resolves.toEqual({ events: [] });
  });

  it.each([
    ['a line without its blank line', 'data: b\n'],
    ['half a line', 'data: b'],
    ['half a character', 'data: \xc3'],
  ])('throws IncompleteSseEventError, after the complete events, for %s left at the end', async (_, rest) => {
    const tail = Buffer.from(rest, 'latin1');
    const { events, error } = await collect(chunksOf(Buffer.from('data: a\n\n'), tail));
    expect(events).toEqual(['data: a\n\n']);
    expect(error).toBeInstanceOf(IncompleteSseEventError);
    expect((error as IncompleteSseEventError).rest.equals(tail)).toBe(true);
  });

  it('throws the body’s own error after the events completed before it', async () => {
    const broken = new Error('socket gone');
    async function* body(): AsyncGenerator<Buffer> {
      yield Buffer.from('data: a\n\ndata: b');
      throw broken;
    }
    await expect(collect(body())).resolves.toEqual({ events: ['data: a\n\n'], error: broken });
  });
});

describe('sseEvents with maxEventBytes', () => {
  it('yields events up to the cap, blank line included, however they are cut', async () => {
    const event = `data: ${'x'.repeat(10)}\n\n`; // 18 bytes
    const body = Buffer.from(event + event);
    for (let cut = 0; cut <= body.length; cut++) {
      const result = await collect(chunksOf(body.subarray(0, cut), body.subarray(cut)), 18);
      expect({ cut, ...result }).toEqual({ cut, events: [event, event] });
    }
  });

  it('throws SseEventTooLargeError, after the events before it, for one event a byte past the cap', async () => {
    const body = Buffer.from(`data: a\n\ndata: ${'x'.repeat(11)}\n\ndata: [DONE]\n\n`);
    for (let cut = 0; cut <= body.length; cut++) {
      const { events, error } = await collect(chunksOf(body.subarray(0, cut), body.subarray(cut)), 18);
      expect({ cut, events }).toEqual({ cut, events: ['data: a\n\n'] });
      expect(error).toBeInstanceOf(SseEventTooLargeError);
    }
  });

  it.each([
    ['CR only', `data: ${'x'.repeat(10)}\r\r`, 'data: [DONE]\r\r'],
    ['CRLF', `data: ${'x'.repeat(8)}\r\n\r\n`, 'data: [DONE]\r\n\r\n'],
    ['a CR line, then a CRLF blank line', `data: ${'x'.repeat(9)}\r\r\n`, 'data: [DONE]\n\n'],
  ])(
    'takes an event of exactly the cap ended by %s, cut at any byte; a byte more is past it',
    async (_how, event, done) => {
      expect(Buffer.byteLength(event)).toBe(18);
      const body = Buffer.from(event + done);
      for (let cut = 0; cut <= body.length; cut++) {
        const result = await collect(chunksOf(body.subarray(0, cut), body.subarray(cut)), 18);
        expect({ cut, ...result }).toEqual({ cut, events: [event, done] });
      }
      const longer = Buffer.from(`data: x${event.slice('data: '.length)}${done}`);
      for (let cut = 0; cut <= longer.length; cut++) {
        const { events, error } = await collect(chunksOf(longer.subarray(0, cut), longer.subarray(cut)), 18);
        expect({ cut, events }).toEqual({ cut, events: [] });
        expect(error).toBeInstanceOf(SseEventTooLargeError);
      }
    },
  );

  it('throws as soon as an open event passes the cap, without waiting for its end or the body’s', async () => {
    let read = 0;
    // 64 KiB if read to its end (what the cap must not wait for).
    async function* endless(): AsyncGenerator<Buffer> {
      yield Buffer.from('data: a\n\n');
      for (; read < 64;) {
        read++;
        yield Buffer.alloc(1024, 'x');
      }
    }
    const { events, error } = await collect(endless(), 4096);
    expect(events).toEqual(['data: a\n\n']);
    expect(error).toBeInstanceOf(SseEventTooLargeError);
    expect(read).toBe(5);
  });

  it('joins the chunks of an event without a line break once, not at every chunk', async () => {
    // Counted, not timed: every chunk is handed over once and none is copied
    // until the event ends (here: at the end of the body).
    const chunk = Buffer.alloc(64 * 1024, 'x');
    let chunks = 0;
    async function* body(): AsyncGenerator<Buffer> {
      for (; chunks < 64; chunks++) yield chunk;
    }
    const concat = jest.spyOn(Buffer, 'concat');
    try {
      const { error } = await collect(body(), 64 * 1024 * 1024);
      expect(error).toBeInstanceOf(IncompleteSseEventError);
      expect((error as IncompleteSseEventError).rest.length).toBe(64 * 64 * 1024);
      expect(concat).toHaveBeenCalledTimes(1);
    } finally {
      concat.mockRestore();
    }
  });
});

describe('sseDataOf', () => {
  it.each([
    ['data: x\n\n', 'x'],
    ['data:x\n\n', 'x'],
    ['data:  x\n\n', ' x'],
    ['data: one\r\ndata: two\r\n\r\n', 'one\ntwo'],
    ['event: e\rid: 1\rdata: x\r\r', 'x'],
    ['data\n\n', ''],
    ['\ufeffdata: x\n\n', 'x'],
    [': comment\n\n', undefined],
    ['\n', undefined],
    ['database: x\n\n', undefined],
  ])('%j has the data %j', (event, data) => {
    expect(sseDataOf(event)).toBe(data);
  });
});

describe('isDoneEvent', () => {
  it.each([
    ['data: [DONE]\n\n', true],
    ['data:[DONE]\r\n\r\n', true],
    ['event: end\ndata: [DONE]\r\r', true],
    ['data: [DONE] \n\n', false],
    ['data: {"content":"[DONE]"}\n\n', false],
    ['data: [DONE]\ndata: more\n\n', false],
    [': [DONE]\n\n', false],
  ])('%j: %s', (event, done) => {
    expect(isDoneEvent(event)).toBe(done);
  });
});
