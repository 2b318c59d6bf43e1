import { classifyLlmError, GatewayAuthError, OpenAiLlmClient } from '@app/llm';
import { getEventListeners } from 'node:events';
import {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  APIUserAbortError,
  AuthenticationError,
  BadRequestError,
  RateLimitError,
} from 'openai';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import { eventually } from '../support/infra';

/**
 * The worker's model client over node:http against a local server: what it
 * sends, and that every outcome reaches RetryPolicy as the SDK's own error
 * class would have (the classifier reads them, and its rules are unchanged).
 */
describe('OpenAiLlmClient over HTTP', () => {
  let server: FakeOpenAiServer;
  let next: ModelReply = { kind: 'complete', content: 'A summary.' };
  const direct = (requestTimeoutMs = 5000) =>
    new OpenAiLlmClient({ apiKey: 'sk-test', baseUrl: server.baseUrl, model: 'gpt-4.1-mini', requestTimeoutMs });
  const gateway = () =>
    new OpenAiLlmClient({
      apiKey: 'internal-key',
      baseUrl: server.baseUrl,
      model: 'gpt-4.1-mini',
      requestTimeoutMs: 5000,
      sendTenant: true,
    });
  const signal = () => new AbortController().signal;
  const failureOf = async (call: Promise<unknown>): Promise<unknown> =>
    call.then(
      () => {
        throw new Error('the call succeeded');
      },
      (err: unknown) => err,
    );

  beforeAll(async () => {
    server = await new FakeOpenAiServer(() => next).start();
  });
  afterAll(() => server.stop());
  beforeEach(() => {
    server.requests.length = 0;
    next = { kind: 'complete', content: 'A summary.' };
  });

  it('sends the chat request with the key, the default model and the call key; a summary sends no key', async () => {
    const llm = direct();
    const completion = await llm.chat(
      { messages: [{ role: 'user', content: 'Classify this.' }], temperature: 0 },
      { signal: signal(), idempotencyKey: 'run-1/step/0', tenant: 'acme' },
    );
    expect(completion.choices[0].message.content).toBe('A summary.');
    await expect(
      llm.summarize('Summarise this.', { signal: signal(), idempotencyKey: 'k', tenant: 'acme' }),
    ).resolves.toBe('A summary.');
    expect(server.requests).toHaveLength(2);
    const [chat, summary] = server.requests;
    expect(chat.body).toEqual({
      messages: [{ role: 'user', content: 'Classify this.' }],
      temperature: 0,
      model: 'gpt-4.1-mini',
      stream: false,
    });
    expect(chat.headers).toMatchObject({
      authorization: 'Bearer sk-test',
      'content-type': 'application/json',
      'idempotency-key': 'run-1/step/0',
    });
    // X-Tenant goes to the gateway only; a direct summary sends neither header, as it always has.
    expect(chat.headers['x-tenant']).toBeUndefined();
    expect(summary.userText).toBe('Summarise this.');
    expect(summary.headers['idempotency-key']).toBeUndefined();
    // Kept alive: the second call went on the first one's connection.
    expect(summary.connection).toBe(chat.connection);
  });

  it('names the tenant on the gateway path, with the call key', async () => {
    await gateway().summarize('Summarise this.', { signal: signal(), idempotencyKey: 'job-9', tenant: 'acme' });
    expect(server.requests[0].headers).toMatchObject({
      authorization: 'Bearer internal-key',
      'idempotency-key': 'job-9',
      'x-tenant': 'acme',
    });
  });

  it("a 400 is the SDK's BadRequestError with the provider's error object, permanent", async () => {
    next = { kind: 'error', status: 400 };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).error).toMatchObject({ message: 'fake error 400', type: 'fake' });
    expect((err as Error).message).toBe('400 fake error 400');
    expect(classifyLlmError(err)).toEqual({ kind: 'client', retryable: false, status: 400 });
  });

  it('a 429 carries its headers: retry-after-ms reaches the classifier', async () => {
    next = { kind: 'error', status: 429, headers: { 'retry-after-ms': '250', 'x-request-id': 'req_1' } };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(RateLimitError);
    expect((err as RateLimitError).requestID).toBe('req_1');
    expect(classifyLlmError(err)).toEqual({ kind: 'rate_limited', retryable: true, status: 429, retryAfterMs: 250 });
  });

  it('x-should-retry: false makes a 503 permanent', async () => {
    next = { kind: 'error', status: 503, headers: { 'x-should-retry': 'false' } };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(classifyLlmError(err)).toEqual({ kind: 'server', retryable: false, status: 503 });
  });

  it('an error body that is not JSON is the message; the status decides', async () => {
    next = { kind: 'raw', status: 502, headers: { 'content-type': 'text/html' }, body: '<h1>Bad Gateway</h1>' };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).status).toBe(502);
    expect((err as Error).message).toContain('<h1>Bad Gateway</h1>');
    expect(classifyLlmError(err)).toEqual({ kind: 'server', retryable: true, status: 502 });
  });

  it('a 2xx whose body is not JSON is refused with a clear error, not retried', async () => {
    next = { kind: 'raw', status: 200, headers: { 'content-type': 'application/json' }, body: 'not json' };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect((err as Error).message).toBe('the model answered 200 with a body that is not JSON');
    expect(classifyLlmError(err)).toEqual({ kind: 'unknown', retryable: false });
  });

  it("a 401 with WWW-Authenticate is the gateway refusing the internal key there, the provider's 401 directly", async () => {
    next = { kind: 'error', status: 401, headers: { 'www-authenticate': 'Bearer' } };
    const viaGateway = await failureOf(gateway().summarize('x', { signal: signal(), tenant: 'acme' }));
    expect(viaGateway).toBeInstanceOf(GatewayAuthError);
    expect(classifyLlmError(viaGateway)).toEqual({ kind: 'gateway_auth', retryable: true, status: 401 });
    const directly = await failureOf(direct().summarize('x', { signal: signal() }));
    expect(directly).toBeInstanceOf(AuthenticationError);
    expect(classifyLlmError(directly)).toEqual({ kind: 'client', retryable: false, status: 401 });
  });

  it('a connection reset before any answer is a connection error, retried', async () => {
    next = { kind: 'reset' };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIConnectionError);
    expect(classifyLlmError(err)).toEqual({ kind: 'connection', retryable: true });
  });

  it('a body cut off midway is a connection error, retried', async () => {
    next = {
      kind: 'huge',
      contentType: 'application/json',
      bytes: 1024 * 1024,
      prefix: '{"id":"',
      breakAfterBytes: 200_000,
    };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIConnectionError);
    expect(classifyLlmError(err).retryable).toBe(true);
  });

  it('a refused connection is a connection error', async () => {
    const closed = await new FakeOpenAiServer().start();
    const baseUrl = closed.baseUrl;
    await closed.stop();
    const llm = new OpenAiLlmClient({ apiKey: 'k', baseUrl, model: 'm', requestTimeoutMs: 5000 });
    const err = await failureOf(llm.chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIConnectionError);
    expect(((err as Error).cause as { code?: string }).code).toBe('ECONNREFUSED');
  });

  it("the caller's abort cuts the request (the server sees it go) and is the SDK's user abort", async () => {
    next = { kind: 'hang' };
    const caller = new AbortController();
    const call = failureOf(direct().chat({ messages: [] }, { signal: caller.signal }));
    await waitFor(() => server.requests.length === 1);
    caller.abort(new Error('attempt limit'));
    const err = await call;
    expect(err).toBeInstanceOf(APIUserAbortError);
    expect(classifyLlmError(err)).toEqual({ kind: 'timeout', retryable: true });
    await waitFor(() => server.requests[0].closedEarly);
  });

  it('an abort while the body arrives is a user abort too', async () => {
    let reached!: () => void;
    const midway = new Promise<void>((r) => (reached = r));
    next = {
      kind: 'huge',
      contentType: 'application/json',
      bytes: 1024 * 1024,
      pause: { afterBytes: 100_000, reached, until: new Promise(() => undefined) },
    };
    const caller = new AbortController();
    const call = failureOf(direct().chat({ messages: [] }, { signal: caller.signal }));
    await midway;
    caller.abort(new Error('attempt limit'));
    expect(await call).toBeInstanceOf(APIUserAbortError);
  });

  it('its own backstop timer cuts a hung request as a connection timeout', async () => {
    next = { kind: 'hang' };
    const err = await failureOf(direct(50).chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIConnectionTimeoutError);
    expect(classifyLlmError(err)).toEqual({ kind: 'connection', retryable: true });
    // The 50 ms backstop may fire before a loaded server has read the request, which it then reads, and sees closed.
    await waitFor(() => server.requests[0]?.closedEarly === true);
  });

  it('a signal already aborted sends nothing', async () => {
    const caller = new AbortController();
    caller.abort();
    expect(await failureOf(direct().chat({ messages: [] }, { signal: caller.signal }))).toBeInstanceOf(
      APIUserAbortError,
    );
    expect(server.requests).toHaveLength(0);
  });

  it("leaves no listener on the caller's signal, after an answer or a failure", async () => {
    const caller = new AbortController();
    await direct().chat({ messages: [] }, { signal: caller.signal });
    next = { kind: 'error', status: 500 };
    await failureOf(direct().chat({ messages: [] }, { signal: caller.signal }));
    next = { kind: 'reset' };
    await failureOf(direct().chat({ messages: [] }, { signal: caller.signal }));
    expect(getEventListeners(caller.signal, 'abort')).toHaveLength(0);
  });

  it('its backstop timer cuts a body that stops midway as a connection timeout', async () => {
    next = {
      kind: 'huge',
      contentType: 'application/json',
      bytes: 1024 * 1024,
      pause: { afterBytes: 100_000, reached: () => undefined, until: new Promise(() => undefined) },
    };
    const err = await failureOf(direct(100).chat({ messages: [] }, { signal: signal() }));
    expect(err).toBeInstanceOf(APIConnectionTimeoutError);
  });

  it('a 4xx whose body breaks off is still that status, permanent', async () => {
    const server400 = await new RawServer((req, res) => {
      // The request read first (a reset over unread bytes can drop the answer's head too), the head and a part sent.
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.write('{"error": {"message": "too long"', () => res.destroy());
      });
    }).start();
    try {
      const llm = new OpenAiLlmClient({ apiKey: 'k', baseUrl: server400.baseUrl, model: 'm', requestTimeoutMs: 5000 });
      const err = await failureOf(llm.chat({ messages: [] }, { signal: signal() }));
      expect(err).toBeInstanceOf(BadRequestError);
      expect(classifyLlmError(err)).toEqual({ kind: 'client', retryable: false, status: 400 });
    } finally {
      await server400.stop();
    }
  });

  it('a key that cannot be a header value is a TypeError before anything is sent, not retried', async () => {
    const err = await failureOf(
      direct().chat({ messages: [] }, { signal: signal(), idempotencyKey: 'run-1\r\nX-Evil: 1' }),
    );
    // node:http's own TypeError (another realm than jest's: its name and code are compared).
    expect((err as Error).name).toBe('TypeError');
    expect((err as { code?: string }).code).toBe('ERR_INVALID_CHAR');
    expect(classifyLlmError(err)).toEqual({ kind: 'unknown', retryable: false });
    expect(server.requests).toHaveLength(0);
  });

  it('a redirect is not followed: its error names where it points, without its query, permanent', async () => {
    next = {
      kind: 'raw',
      status: 307,
      headers: { location: 'https://models.example/v2/chat/completions?sig=secret' },
      body: '',
    };
    const err = await failureOf(direct().chat({ messages: [] }, { signal: signal() }));
    expect((err as Error).message).toBe('307 redirected to https://models.example/v2/chat/completions, not followed');
    expect((err as Error).message).not.toContain('secret');
    expect(classifyLlmError(err)).toEqual({ kind: 'client', retryable: false, status: 307 });
    expect(server.requests).toHaveLength(1);
  });

  it('reads an answer a proxy gzipped anyway, and one that starts with a byte-order mark', async () => {
    const completion = (content: string) =>
      JSON.stringify({
        id: 'c',
        object: 'chat.completion',
        choices: [{ index: 0, message: { role: 'assistant', content } }],
      });
    next = {
      kind: 'raw',
      status: 200,
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body: gzipSync(completion('Zipped.')),
    };
    await expect(direct().summarize('x', { signal: signal() })).resolves.toBe('Zipped.');
    expect(server.requests[0].headers['accept-encoding']).toBe('identity');
    next = {
      kind: 'raw',
      status: 200,
      headers: { 'content-type': 'application/json' },
      body: `\uFEFF${completion('Marked.')}`,
    };
    await expect(direct().summarize('x', { signal: signal() })).resolves.toBe('Marked.');
  });

  it("keeps the API root's path and query (Azure's api-version) around the route", async () => {
    const seen: string[] = [];
    const azure = await new RawServer((req, res) => {
      seen.push(req.url ?? '');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'c', choices: [{ index: 0, message: { role: 'assistant', content: 'Azure.' } }] }));
    }).start();
    try {
      const llm = new OpenAiLlmClient({
        apiKey: 'k',
        baseUrl: `${azure.origin}/openai/deployments/d1/?api-version=2024-10-21`,
        model: 'm',
        requestTimeoutMs: 5000,
      });
      await expect(llm.summarize('x', { signal: signal() })).resolves.toBe('Azure.');
      expect(seen).toEqual(['/openai/deployments/d1/chat/completions?api-version=2024-10-21']);
    } finally {
      await azure.stop();
    }
  });
});

/** A bare HTTP server for the cases FakeOpenAiServer has no reply for. */
class RawServer {
  readonly server;

  constructor(handler: Parameters<typeof createServer>[1]) {
    this.server = createServer(handler);
  }

  async start(): Promise<this> {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return this;
  }

  get origin(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  get baseUrl(): string {
    return `${this.origin}/v1`;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

/** Resolves once `done()` holds. */
async function waitFor(done: () => boolean): Promise<void> {
  await eventually(() => (done() ? true : undefined));
}
