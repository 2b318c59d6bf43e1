import { FrameChannel, framesResponse } from './streamed-answer';

describe('FrameChannel', () => {
  it('hands frames over in order and ends', async () => {
    const channel = new FrameChannel(1024);
    await channel.push('a');
    await channel.push('b');
    channel.end();
    const out: string[] = [];
    for await (const frame of channel) out.push(frame);
    expect(out).toEqual(['a', 'b']);
  });

  it('lets the writer on at once below the high-water mark, and makes it wait above until the caller reads', async () => {
    const channel = new FrameChannel(4);
    await channel.push('abc'); // 3 of 4: no wait
    let through = false;
    const waiting = channel.push('defg').then(() => (through = true)); // 7 of 4: waits
    await new Promise((r) => setImmediate(r));
    expect(through).toBe(false);
    const reader = channel[Symbol.asyncIterator]();
    expect((await reader.next()).value).toBe('abc');
    await waiting;
    expect(through).toBe(true);
  });

  it('lets a waiting writer go when the caller leaves, and drops what comes after', async () => {
    const channel = new FrameChannel(1);
    const waiting = channel.push('too much');
    channel.detach();
    await waiting;
    await channel.push('dropped');
    channel.end();
    const out: string[] = [];
    for await (const frame of channel) out.push(frame);
    expect(out).toEqual([]);
  });

  it('ends the reader with the failure after the frames before it', async () => {
    const channel = new FrameChannel(1024);
    await channel.push('a');
    channel.fail(new Error('broke'));
    const out: string[] = [];
    await expect(
      (async () => {
        for await (const frame of channel) out.push(frame);
      })(),
    ).rejects.toThrow('broke');
    expect(out).toEqual(['a']);
  });
});

describe('framesResponse', () => {
  it('runs onCancel when the body is cancelled before its first read, once', async () => {
    let cancelled = 0;
    let started = false;
    async function* frames(): AsyncGenerator<string> {
      started = true;
      yield 'never read';
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
        yield 'a';
        yield 'b';
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
    expect(chunks).toEqual(['a', 'b']);
    expect(cancelled).toBe(1);
  });
});
