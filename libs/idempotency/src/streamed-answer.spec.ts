import { bytesOf, FrameChannel, framesResponse } from './streamed-answer';

const b = (text: string): Buffer => Buffer.from(text);

describe('FrameChannel', () => {
  it('hands frames over in order and ends', async () => {
    const channel = new FrameChannel(1024);
    await channel.push(b('a'));
    await channel.push(b('b'));
    channel.end();
    const out: string[] = [];
    for await (const frame of channel) out.push(frame.toString());
    expect(out).toEqual(['a', 'b']);
  });

  it('lets the writer on at once below the high-water mark, and makes it wait above until the caller reads', async () => {
    const channel = new FrameChannel(4);
    await channel.push(b('abc')); // 3 of 4: no wait
    let through = false;
    const waiting = channel.push(b('defg')).then(() => (through = true)); // 7 of 4: waits
    await new Promise((r) => setImmediate(r));
    expect(through).toBe(false);
    const reader = channel[Symbol.asyncIterator]();
    expect((await reader.next()).value).toEqual(b('abc'));
    await waiting;
    expect(through).toBe(true);
  });

  it('lets a waiting writer go when the caller leaves, and drops what comes after', async () => {
    const channel = new FrameChannel(1);
    const waiting = channel.push(b('too much'));
    channel.detach();
    await waiting;
    await channel.push(b('dropped'));
    channel.end();
    const out: string[] = [];
    for await (const frame of channel) out.push(frame.toString());
    expect(out).toEqual([]);
  });

  it('ends the reader with the failure after the frames before it', async () => {
    const channel = new FrameChannel(1024);
    await channel.push(b('a'));
    channel.fail(new Error('broke'));
    const out: string[] = [];
    await expect(
      (async () => {
        for await (const frame of channel) out.push(frame.toString());
      })(),
    ).rejects.toThrow('broke');
    expect(out).toEqual(['a']);
  });
});

describe('framesResponse', () => {
  it('runs onCancel when the body is cancelled before its first read, once', async () => {
    let cancelled = 0;
    let started = false;
    async function* frames(): AsyncGenerator<Buffer> {
      started = true;
      yield b('never read');
    }
    const response = framesResponse(200, new Headers(), frames(), () => cancelled++);
    await response.body!.cancel();
    await response.body!.cancel().catch(() => undefined);
    expect(cancelled).toBe(1);
    expect(started).toBe(false);
  });

  it('sends the frames as they come and runs onCancel at the end too', async () => {
    let cancelled = 0;
    const response = framesResponse(
      200,
      new Headers({ 'content-type': 'text/plain' }),
      (async function* () {
        yield b('a');
        yield Buffer.from([0xff, 0xfe]);
      })(),
      () => cancelled++,
    );
    const reader = response.body!.getReader();
    const chunks: unknown[] = [];
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
    }
    // Bytes as they are, not UTF-8 decoded and encoded again.
    expect(chunks.map((c) => Buffer.from(c as Uint8Array))).toEqual([b('a'), Buffer.from([0xff, 0xfe])]);
    expect(cancelled).toBe(1);
  });
});

describe('bytesOf', () => {
  it('encodes text once as UTF-8 and takes bytes as they are, without a copy', () => {
    expect(bytesOf('naïve\u0000')).toEqual(Buffer.from('6e61c3af766500', 'hex'));
    const buffer = Buffer.from([0xff, 0x00, 0xfe]);
    expect(bytesOf(buffer)).toBe(buffer);
    const view = new Uint8Array([1, 2, 3, 4]).subarray(1, 3);
    expect(bytesOf(view)).toEqual(Buffer.from([2, 3]));
  });
});
