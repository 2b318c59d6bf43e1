import {
  HttpChatCompletionsUpstream,
  UpstreamTimeoutError,
  UpstreamUnreachableError,
  type UpstreamRequest,
} from '@app/llm';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import { RecordingServer } from '../support/recording-server';

/** Resolves once the provider's side of the connection has closed (the test times out if it never does). */
async function closed(socket: Socket): Promise<void> {
  if (!socket.destroyed) await once(socket, 'close');
}

async function readAll(body: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

const BODY = Buffer.from(
  '{ "model" : "gpt-4.1-mini",\n  "messages": [{"role": "user", "content": "héllo 🙂"}], "stream": false }',
);
const request = (overrides: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  body: BODY,
  json: JSON.parse(BODY.toString()),
  signal: AbortSignal.timeout(5000),
  ...overrides,
});

describe('HttpChatCompletionsUpstream against a local provider', () => {
  let provider: RecordingServer;
  let upstream: HttpChatCompletionsUpstream;

  beforeEach(async () => {
    provider = await new RecordingServer((res) => res.end('{}')).start();
    upstream = new HttpChatCompletionsUpstream({ apiKey: 'sk-test', baseUrl: `${provider.url('/v1')}/` });
  });
  afterEach(async () => {
    upstream.close();
    await provider.stop();
  });

  it('posts the body byte for byte with the key, the Idempotency-Key and the content headers', async () => {
    provider.handle = (res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    const answer = await upstream.send(request({ idempotencyKey: 'key-0123456789abcdef' }));
    await readAll(answer.body);

    expect(provider.seen).toHaveLength(1);
    const [seen] = provider.seen;
    expect(seen.method).toBe('POST');
    expect(seen.url).toBe('/v1/chat/completions');
    expect(seen.body.equals(BODY)).toBe(true);
    expect(seen.headers).toMatchObject({
      authorization: 'Bearer sk-test',
      'idempotency-key': 'key-0123456789abcdef',
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'content-length': String(BODY.length),
    });
  });

  it('sends no Idempotency-Key when the client gave none', async () => {
    await readAll((await upstream.send(request())).body);
    expect(provider.seen[0].headers).not.toHaveProperty('idempotency-key');
  });

  it('passes on the status, the relayed headers only, and the body', async () => {
    provider.handle = (res) =>
      res
        .writeHead(200, {
          'content-type': 'application/json',
          'x-request-id': 'req_1',
          'openai-processing-ms': '12',
          'x-ratelimit-remaining-requests': '99',
          'x-ratelimit-reset-tokens': '1s',
          'set-cookie': '__cf_bm=secret',
          'openai-organization': 'org-x',
          server: 'provider',
        })
        .end('{"id":"chatcmpl-1"}');
    const answer = await upstream.send(request());
    expect(answer.status).toBe(200);
    expect(answer.headers).toEqual({
      'content-type': 'application/json',
      'x-request-id': 'req_1',
      'openai-processing-ms': '12',
      'x-ratelimit-remaining-requests': '99',
      'x-ratelimit-reset-tokens': '1s',
    });
    expect((await readAll(answer.body)).toString()).toBe('{"id":"chatcmpl-1"}');
  });

  it('relays a non-2xx as it is, Retry-After included', async () => {
    const error = '{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}';
    provider.handle = (res) =>
      res
        .writeHead(429, {
          'content-type': 'application/json',
          'retry-after': '7',
          'retry-after-ms': '6500',
          'x-should-retry': 'true',
        })
        .end(error);
    const answer = await upstream.send(request());
    expect(answer.status).toBe(429);
    expect(answer.headers).toEqual({
      'content-type': 'application/json',
      'retry-after': '7',
      'retry-after-ms': '6500',
      'x-should-retry': 'true',
    });
    expect((await readAll(answer.body)).toString()).toBe(error);
  });

  it('relays a stream chunk by chunk, as the provider writes them', async () => {
    // The provider writes the next event only once the reader has the previous one.
    const events = ['data: {"n":1}\n\n', 'data: {"n":2,"t":"é🙂"}\n\n', 'data: [DONE]\n\n'];
    const delivered: Array<() => void> = [];
    const nextDelivered = () => new Promise<void>((resolve) => delivered.push(resolve));
    let written = 0;
    provider.handle = async (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const event of events) {
        const read = nextDelivered();
        res.write(event);
        written++;
        await read;
      }
      res.end();
    };
    const answer = await upstream.send(request());
    expect(answer.headers['content-type']).toBe('text/event-stream');
    const received: Array<{ chunk: string; written: number }> = [];
    for await (const chunk of answer.body) {
      received.push({ chunk: chunk.toString(), written });
      delivered.shift()?.();
    }
    expect(received).toEqual(events.map((chunk, i) => ({ chunk, written: i + 1 })));
  });

  it('slows the provider down when the reader is slow: the body is not buffered', async () => {
    const total = 64 * 1024 * 1024;
    let sent = 0;
    provider.handle = async (res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const block = Buffer.alloc(64 * 1024, 'a');
      while (sent < total) {
        sent += block.length;
        if (!res.write(block)) await once(res, 'drain');
      }
      res.end();
    };
    // 64 MiB through loopback: on a loaded machine that takes seconds, and the call's usual 5 s is not what this test
    // is about.
    const answer = await upstream.send(request({ signal: AbortSignal.timeout(25_000) }));
    await delay(300);
    // Socket buffers hold a few MiB on loopback; an unread body stops the provider there.
    expect(sent).toBeLessThan(total / 4);
    expect((await readAll(answer.body)).length).toBe(total);
  });

  it('reuses one kept-alive connection for calls one after another', async () => {
    for (let i = 0; i < 3; i++) await readAll((await upstream.send(request())).body);
    expect(provider.seen).toHaveLength(3);
    expect(provider.connections).toHaveLength(1);
    expect(new Set(provider.seen.map((s) => s.socket)).size).toBe(1);
  });

  it.each([
    ['before the call', true],
    ['just as the call took it from the pool', false],
  ])('sends on a new connection when the provider closed the idle kept-alive one %s', async (_, closedBefore) => {
    await readAll((await upstream.send(request())).body);
    // Back in the agent's pool once the response's end has been handled.
    await new Promise(setImmediate);
    const [idle] = provider.connections;
    // The provider's idle timeout: it closes its end. Its FIN is not read
    // here yet when the call takes the socket (or is not even sent yet).
    if (closedBefore) idle.destroy();
    const sending = upstream.send(request());
    if (!closedBefore) idle.destroy();
    const answer = await sending;
    expect(answer.status).toBe(200);
    expect((await readAll(answer.body)).toString()).toBe('{}');
    expect(provider.seen).toHaveLength(2);
    expect(provider.connections).toHaveLength(2);
  });

  it('never sends again a request the provider received on a reused connection, then reset', async () => {
    // The provider has the whole request (it may be generating, and billing) when the connection breaks.
    provider.handle = (res, seen) => {
      if (provider.seen.filter((s) => s.socket === seen.socket).length > 1) seen.socket.destroy();
      else res.end('{"ok":true}');
    };
    await readAll((await upstream.send(request())).body);
    const err = await upstream.send(request()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UpstreamUnreachableError);
    expect(err).toMatchObject({ code: 'ECONNRESET', requestSent: true });
    expect(provider.seen).toHaveLength(2);
    expect(provider.connections).toHaveLength(1);
  });

  it('never sends again a request the provider reset on a reused connection as it arrived', async () => {
    // RST, not FIN, once the request's first bytes are there: what a provider that crashed mid-read does.
    provider.handle = (res) => res.end('{"ok":true}');
    await readAll((await upstream.send(request())).body);
    const [connection] = provider.connections;
    connection.once('data', () => connection.resetAndDestroy());
    const err = await upstream.send(request()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UpstreamUnreachableError);
    expect(err).toMatchObject({ code: 'ECONNRESET', requestSent: true });
    expect(provider.connections).toHaveLength(1);
  });

  it('does not send again when a new connection is reset before the head', async () => {
    provider.handle = (_, seen) => void seen.socket.destroy();
    const err = await upstream.send(request()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UpstreamUnreachableError);
    expect(err).toMatchObject({ code: 'ECONNRESET', requestSent: true });
    expect(provider.seen).toHaveLength(1);
  });

  it('is an UpstreamTimeoutError when the provider never answers and the signal times out', async () => {
    // The provider never answers: only the signal can end the call.
    provider.handle = () => undefined;
    const err = await upstream.send(request({ signal: AbortSignal.timeout(200) })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UpstreamTimeoutError);
    // The connection is closed, not left to the provider: its socket sees the close.
    await closed(provider.connections[0]);
  });

  it('rejects with the signal’s reason for any other abort, and sends nothing for a signal already aborted', async () => {
    // Aborted once the provider has the request: on a busy machine a fixed pause may come before it arrives.
    let arrived!: () => void;
    const received = new Promise<void>((resolve) => (arrived = resolve));
    provider.handle = () => arrived();
    const shutdown = new AbortController();
    const reason = new Error('shutting down');
    const sent = upstream.send(request({ signal: shutdown.signal }));
    await received;
    shutdown.abort(reason);
    await expect(sent).rejects.toBe(reason);

    await expect(upstream.send(request({ signal: shutdown.signal }))).rejects.toBe(reason);
    expect(provider.seen).toHaveLength(1);
  });

  it('makes the body throw when the connection breaks mid-body', async () => {
    provider.handle = async (res, seen) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n');
      await delay(50);
      seen.socket.destroy();
    };
    const answer = await upstream.send(request());
    const chunks: string[] = [];
    const err = await (async () => {
      for await (const chunk of answer.body) chunks.push(chunk.toString());
    })().catch((e: unknown) => e);
    expect(chunks).toEqual(['data: {"n":1}\n\n']);
    // node:http's own error for a response cut short (an Error of another realm under jest).
    expect(err).toMatchObject({ code: 'ECONNRESET', message: 'aborted' });
  });

  it('makes the body throw the signal’s reason when it aborts mid-body, and closes the connection', async () => {
    provider.handle = (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n');
    };
    const call = new AbortController();
    const reason = new Error('gateway timeout');
    const answer = await upstream.send(request({ signal: call.signal }));
    const err = await (async () => {
      for await (const _ of answer.body) call.abort(reason);
    })().catch((e: unknown) => e);
    expect(err).toBe(reason);
    await closed(provider.connections[0]);
  });

  it('does not crash the process when the body breaks before anyone reads it', async () => {
    provider.handle = (res, seen) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n', () => seen.socket.destroy());
    };
    const answer = await upstream.send(request());
    await delay(100);
    await expect(readAll(answer.body)).rejects.toMatchObject({ code: 'ECONNRESET' });
  });

  it('close() ends the kept-alive connections', async () => {
    await readAll((await upstream.send(request())).body);
    const [connection] = provider.connections;
    expect(connection.destroyed).toBe(false);
    upstream.close();
    await once(connection, 'close');
  });
});

describe('HttpChatCompletionsUpstream without a provider', () => {
  it('is an UpstreamUnreachableError when the connection is refused', async () => {
    const closed = createServer();
    closed.listen(0, '127.0.0.1');
    await once(closed, 'listening');
    const { port } = closed.address() as AddressInfo;
    await new Promise((resolve) => closed.close(resolve));

    const upstream = new HttpChatCompletionsUpstream({ apiKey: 'sk-test', baseUrl: `http://127.0.0.1:${port}/v1` });
    const err = await upstream.send(request()).catch((e: unknown) => e);
    upstream.close();
    expect(err).toBeInstanceOf(UpstreamUnreachableError);
    expect(err).toMatchObject({ code: 'ECONNREFUSED', requestSent: false });
  });
});
