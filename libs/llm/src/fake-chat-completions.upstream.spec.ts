import OpenAI, { BadRequestError } from 'openai';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { UpstreamTimeoutError, type UpstreamResponse } from './chat-completions.upstream';
import { FakeChatCompletionsUpstream } from './fake-chat-completions.upstream';
import { sseEvents } from './sse-event.splitter';

const PREFIX = 'This is the built-in fake model. You wrote: ';

const send = (
  json: unknown,
  upstream = new FakeChatCompletionsUpstream(),
  signal = new AbortController().signal,
): Promise<UpstreamResponse> => upstream.send({ body: Buffer.from(JSON.stringify(json)), json, signal });

async function text(body: AsyncIterable<Buffer>): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks).toString();
}

/** Fakes Date alone, still at `now`: the server and the client keep jest's real timers. */
function fakeDateOnly(now: number): void {
  jest.useFakeTimers({
    now,
    doNotFake: [
      'hrtime',
      'nextTick',
      'performance',
      'queueMicrotask',
      'requestAnimationFrame',
      'cancelAnimationFrame',
      'requestIdleCallback',
      'cancelIdleCallback',
      'setImmediate',
      'clearImmediate',
      'setInterval',
      'clearInterval',
      'setTimeout',
      'clearTimeout',
    ],
  });
}

/** The fake behind a local HTTP server, as the gateway would relay it, so the real openai SDK reads it. */
describe('the built-in fake model, read by the openai SDK', () => {
  let server: Server;
  let openai: OpenAI;

  beforeAll(async () => {
    const upstream = new FakeChatCompletionsUpstream();
    server = createServer((req, res) => {
      void (async () => {
        const chunks: Buffer[] = [];
        for await (const chunk of req) chunks.push(chunk as Buffer);
        const body = Buffer.concat(chunks);
        const answer = await upstream.send({
          body,
          json: JSON.parse(body.toString()),
          signal: AbortSignal.timeout(5000),
        });
        res.writeHead(answer.status, answer.headers);
        await pipeline(Readable.from(answer.body), res);
      })().catch((err: unknown) => res.destroy(err as Error));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    openai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x', maxRetries: 0 });
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
  afterEach(() => jest.useRealTimers());

  it('streams the answer word by word, then the usage, in OpenAI’s chunks', async () => {
    // `created` is the whole second of the answer: with only Date faked (and still), it is known exactly.
    const now = Date.UTC(2026, 0, 2, 3, 4, 5, 678);
    fakeDateOnly(now);
    const stream = await openai.chat.completions.create({
      model: 'gpt-4.1-mini',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'An earlier question' },
        { role: 'assistant', content: 'An answer' },
        { role: 'user', content: 'Hello there, fake model' },
      ],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);

    const expected = `${PREFIX}"Hello there, fake model"`;
    const words = expected.split(' ').length;
    expect(chunks).toHaveLength(1 + words + 2);
    expect(chunks[0].choices[0]).toMatchObject({
      index: 0,
      delta: { role: 'assistant', content: '' },
      finish_reason: null,
    });
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe(expected);
    expect(chunks.slice(1, 1 + words).map((c) => c.choices[0].delta.content)).toEqual(expected.split(/(?= )/));
    expect(chunks.at(-2)?.choices[0]).toMatchObject({ delta: {}, finish_reason: 'stop' });
    expect(chunks.at(-1)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 11, completion_tokens: words, total_tokens: 11 + words },
    });
    expect(chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
    expect(new Set(chunks.map((c) => `${c.id} ${c.created} ${c.model} ${c.object}`))).toEqual(
      new Set([`${chunks[0].id} ${chunks[0].created} gpt-4.1-mini chat.completion.chunk`]),
    );
    expect(chunks[0].id).toMatch(/^chatcmpl-\w+$/);
    expect(chunks[0].created).toBe(Math.floor(now / 1000));
  });

  it('streams without usage unless asked for it', async () => {
    const stream = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'Hi' }],
      stream: true,
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.every((c) => !('usage' in c) && c.choices.length === 1)).toBe(true);
    expect(chunks.at(-1)?.choices[0].finish_reason).toBe('stop');
  });

  it('answers a request without a stream with one chat.completion', async () => {
    const completion = await openai.chat.completions.create({
      model: 'gpt-4.1-mini',
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'First part.' },
            { type: 'image_url', image_url: { url: 'https://example.com/a.png' } },
            { type: 'text', text: 'Second part.' },
          ],
        },
      ],
    });
    expect(completion).toMatchObject({
      object: 'chat.completion',
      model: 'gpt-4.1-mini',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: `${PREFIX}"First part. Second part."` },
          finish_reason: 'stop',
        },
      ],
      usage: { prompt_tokens: 4, completion_tokens: 12, total_tokens: 16 },
    });
    expect(completion.id).toMatch(/^chatcmpl-\w+$/);
  });

  it('stops at max_tokens, or max_completion_tokens, with finish_reason length', async () => {
    const cut = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 3,
    });
    expect(cut.choices[0]).toMatchObject({ message: { content: 'This is the' }, finish_reason: 'length' });
    expect(cut.usage?.completion_tokens).toBe(3);

    const stream = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'Hi' }],
      max_completion_tokens: 2,
      stream: true,
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.map((c) => c.choices[0].delta.content ?? '').join('')).toBe('This is');
    expect(chunks.at(-1)?.choices[0].finish_reason).toBe('length');
  });

  it('quotes at most 200 characters of the user’s text, never half a character', async () => {
    const long = `${'😀'.repeat(199)}${'x'.repeat(500)}`;
    const completion = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: long }],
    });
    expect(completion.choices[0].message.content).toBe(`${PREFIX}"${'😀'.repeat(199)}x"`);
  });

  it.each([
    ['no messages', { model: 'm', messages: [] }, 'messages'],
    ['no model', { model: '', messages: [{ role: 'user', content: 'Hi' }] }, 'model'],
  ])('refuses a request with %s as OpenAI does: a 400 the SDK raises as BadRequestError', async (_, body, param) => {
    const err = await openai.chat.completions
      .create(body as OpenAI.ChatCompletionCreateParamsNonStreaming)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    expect(err).toMatchObject({ status: 400, type: 'invalid_request_error', param, code: null });
  });
});

describe('the built-in fake model on the wire', () => {
  it('sends data: events with a blank line after each, and data: [DONE] last', async () => {
    const answer = await send({
      model: 'm',
      messages: [{ role: 'user', content: 'Hi' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(answer.status).toBe(200);
    expect(answer.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    const events: string[] = [];
    for await (const event of sseEvents(answer.body)) events.push(event);
    expect(events.at(-1)).toBe('data: [DONE]\n\n');
    expect(events.slice(0, -1).every((e) => /^data: \{.*\}\n\n$/s.test(e) && !e.slice(6, -2).includes('\n'))).toBe(
      true,
    );
    expect(events.slice(0, -2).every((e) => e.includes('"usage":null'))).toBe(true);
  });

  it.each([
    ['a body that is not an object', ['m'], 'model'],
    ['no model', { messages: [{ role: 'user', content: 'Hi' }] }, 'model'],
    ['a model that is not a string', { model: 4, messages: [{ role: 'user', content: 'Hi' }] }, 'model'],
    ['messages that are not an array', { model: 'm', messages: 'Hi' }, 'messages'],
    ['no messages', { model: 'm' }, 'messages'],
  ])('answers %s with a 400 in OpenAI’s error envelope', async (_, json, param) => {
    const answer = await send(json);
    expect(answer).toMatchObject({ status: 400, headers: { 'content-type': 'application/json' } });
    expect(JSON.parse(await text(answer.body))).toEqual({
      error: { message: expect.any(String), type: 'invalid_request_error', param, code: null },
    });
  });

  it('answers a conversation without a user message', async () => {
    const answer = await send({ model: 'm', messages: [{ role: 'system', content: 'Be brief.' }] });
    expect(JSON.parse(await text(answer.body)).choices[0].message.content).toBe(`${PREFIX}""`);
  });

  it('is an UpstreamTimeoutError when a timeout ends the wait for the first byte', async () => {
    // An hour to the first byte: only the signal can end this wait within the test's time.
    const slow = new FakeChatCompletionsUpstream({ firstByteMs: 3_600_000 });
    await expect(send({ model: 'm', messages: [] }, slow, AbortSignal.timeout(50))).rejects.toBeInstanceOf(
      UpstreamTimeoutError,
    );
  });

  it('rejects with the signal’s reason for any other abort before the head', async () => {
    const shutdown = new AbortController();
    const reason = new Error('shutting down');
    shutdown.abort(reason);
    await expect(send({ model: 'm', messages: [] }, new FakeChatCompletionsUpstream(), shutdown.signal)).rejects.toBe(
      reason,
    );
  });

  it('stops the stream with the signal’s reason when it aborts midway', async () => {
    const call = new AbortController();
    const reason = new Error('gateway timeout');
    const answer = await send(
      { model: 'm', messages: [{ role: 'user', content: 'Hi' }], stream: true },
      new FakeChatCompletionsUpstream({ chunkMs: 10 }),
      call.signal,
    );
    const seen: string[] = [];
    const read = (async () => {
      for await (const event of sseEvents(answer.body)) {
        seen.push(event);
        if (seen.length === 2) call.abort(reason);
      }
    })();
    await expect(read).rejects.toBe(reason);
    expect(seen).toHaveLength(2);
  });

  it('waits firstByteMs before the head and chunkMs between chunks', async () => {
    // Each wait is raced against a timer of the same length set just before
    // it: Node fires timers of one length in the order they were set, so the
    // timer has fired when the head (or the next chunk) comes exactly when
    // the fake waited its whole length. No clock readings to compare.
    const timerOf = (ms: number) => {
      const timer = { fired: false };
      setTimeout(() => (timer.fired = true), ms);
      return timer;
    };
    const paced = new FakeChatCompletionsUpstream({ firstByteMs: 100, chunkMs: 20 });
    const head = timerOf(100);
    const answer = await send({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], stream: true }, paced);
    expect(head.fired).toBe(true);
    let events = 0;
    const early: number[] = [];
    let gap: { fired: boolean } | undefined;
    // The body is pulled: the fake starts its wait for the next chunk only when this loop asks for it.
    for await (const _ of sseEvents(answer.body)) {
      if (gap && !gap.fired) early.push(events);
      events++;
      gap = timerOf(20);
    }
    expect(events).toBeGreaterThan(2);
    expect(early).toEqual([]);
  });
});
