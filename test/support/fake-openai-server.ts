import { responseBody, responsesUserText } from '@app/llm';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What the fake model does with one request. */
export type ModelReply =
  | { readonly kind: 'complete'; readonly content: string | null; readonly delayMs?: number }
  | {
      readonly kind: 'error';
      readonly status: number;
      readonly headers?: Record<string, string>;
      readonly delayMs?: number;
    }
  /** Accepts the request and never answers. */
  | { readonly kind: 'hang' }
  /** Sends 200 headers, then one byte every `everyMs`, for ever. */
  | { readonly kind: 'drip'; readonly everyMs: number }
  /**
   * A server-sent event stream: `events` written one at a time, `everyMs`
   * apart (each waiting for `gate(i)` when given), then the connection ends
   * (or is destroyed after `breakAfter` events, a provider that dies mid-stream).
   */
  | {
      readonly kind: 'stream';
      readonly events: readonly (string | Buffer)[];
      readonly everyMs?: number;
      readonly breakAfter?: number;
      readonly gate?: (index: number) => Promise<void>;
      /** How long after the last event the body ends (a provider that ends its chunked body late). */
      readonly endAfterMs?: number;
    }
  /** The exact bytes given, as the whole answer. */
  | {
      readonly kind: 'raw';
      readonly status: number;
      readonly headers: Record<string, string>;
      readonly body: string | Buffer;
    }
  /**
   * A 200 of `bytes` bytes: `prefix`, then `x`s, then `suffix` (as many `x`s as
   * make up the size), written 64 KiB at a time as fast as the reader takes
   * them, never held whole. After `pause.afterBytes` it resolves
   * `pause.reached` and waits for `pause.until`. `onWrite` runs after every write.
   */
  | {
      readonly kind: 'huge';
      readonly contentType: string;
      readonly bytes: number;
      readonly prefix?: string;
      readonly suffix?: string;
      readonly pause?: { readonly afterBytes: number; readonly reached: () => void; readonly until: Promise<void> };
      /** Destroys the connection once this many bytes are written: a provider that dies mid-body. */
      readonly breakAfterBytes?: number;
      readonly onWrite?: () => void;
    }
  /** Reads the whole request, then destroys the connection without a byte of answer. */
  | { readonly kind: 'reset' };

export interface SeenRequest {
  readonly n: number;
  /** Which API: `chat/completions` or `responses`. */
  readonly api: 'chat/completions' | 'responses';
  readonly model: string;
  readonly userText: string;
  /** The request's headers, names in lower case. */
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  /** The request body's bytes as received. */
  readonly rawBody: Buffer;
  /** The same body, parsed. */
  readonly body: Record<string, unknown>;
  /** Which connection it came on: 1 for the first the server accepted, and so on. */
  readonly connection: number;
  /** Whether the client hung up before the server finished. */
  closedEarly: boolean;
  /** The answer's body bytes written so far. */
  bytesSent: number;
}

/** An OpenAI chat.completion.chunk stream for `content`, one chunk per word, with the usage chunk. */
export function completionEvents(
  content: string,
  options: { id?: string; model?: string; usage?: boolean } = {},
): string[] {
  const id = options.id ?? 'chatcmpl-stream-1';
  const base = { id, object: 'chat.completion.chunk', created: 1_700_000_000, model: options.model ?? 'gpt-test' };
  const usageNull = options.usage ? { usage: null } : {};
  const chunk = (choices: unknown[], extra: object = usageNull) =>
    `data: ${JSON.stringify({ ...base, choices, ...extra })}\n\n`;
  const words = content.split(/(?<= )/);
  const events = [chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }])];
  for (const word of words) events.push(chunk([{ index: 0, delta: { content: word }, finish_reason: null }]));
  events.push(chunk([{ index: 0, delta: {}, finish_reason: 'stop' }]));
  if (options.usage)
    events.push(
      chunk([], { usage: { prompt_tokens: 11, completion_tokens: words.length, total_tokens: 11 + words.length } }),
    );
  events.push('data: [DONE]\n\n');
  return events;
}

/**
 * A local stand-in for the OpenAI API (POST /v1/chat/completions and POST
 * /v1/responses: a `complete` reply is a response object there, a `stream`
 * reply's events are the test's, see responseEvents in @app/llm), so the
 * real `openai` SDK and HTTP stack run in tests. `reply` decides per request;
 * when it returns a promise, the request waits for it (a test can change the
 * world at the moment the model is called, before the worker goes on).
 */
export class FakeOpenAiServer {
  readonly requests: SeenRequest[] = [];
  /** Calls of a response's own routes (GET, cancel, DELETE), as `METHOD /path?query` under /v1. */
  readonly responseRouteCalls: string[] = [];
  /** How a response's own routes answer; by default 404, as OpenAI's for an id it does not know. */
  responseRoute: (call: string) => ModelReply = () => ({ kind: 'error', status: 404 });
  private server: Server | undefined;
  private open = new Set<ServerResponse>();
  private readonly connections = new WeakMap<object, number>();
  private connectionCount = 0;
  private active = 0;
  /** Most requests in progress at the same time. */
  peakConcurrency = 0;

  constructor(
    public reply: (n: number, text: string, seen: SeenRequest) => ModelReply | Promise<ModelReply> = () => ({
      kind: 'complete',
      content: 'A summary.',
    }),
  ) {}

  get baseUrl(): string {
    const { port } = this.server!.address() as AddressInfo;
    return `http://127.0.0.1:${port}/v1`;
  }

  get calls(): number {
    return this.requests.length;
  }

  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', r));
    return this;
  }

  async stop(): Promise<void> {
    for (const res of this.open) res.destroy();
    await new Promise<void>((r) => this.server?.close(() => r()) ?? r());
  }

  private connectionOf(socket: object): number {
    let n = this.connections.get(socket);
    if (n === undefined) {
      n = ++this.connectionCount;
      this.connections.set(socket, n);
    }
    return n;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const under = /\/v1\/(responses\/[^?]+(?:\?.*)?)$/.exec(req.url ?? '');
    if (under !== null) {
      const call = `${req.method} ${under[1]}`;
      this.responseRouteCalls.push(call);
      return this.answer(this.responseRoute(call), req, res, undefined);
    }
    const api = req.url?.endsWith('/chat/completions')
      ? 'chat/completions'
      : req.url?.endsWith('/responses')
        ? 'responses'
        : undefined;
    if (req.method !== 'POST' || api === undefined) {
      res.writeHead(404).end();
      return;
    }
    const rawBody = Buffer.concat(chunks);
    const body = JSON.parse(rawBody.toString('utf8')) as {
      model: string;
      messages?: { role: string; content: string }[];
    };
    const seen: SeenRequest = {
      n: this.requests.length + 1,
      api,
      model: body.model,
      userText:
        api === 'responses' ? responsesUserText(body) : (body.messages?.find((m) => m.role === 'user')?.content ?? ''),
      headers: { ...req.headers },
      rawBody,
      body,
      connection: this.connectionOf(req.socket),
      closedEarly: false,
      bytesSent: 0,
    };
    this.requests.push(seen);
    this.open.add(res);
    this.active++;
    this.peakConcurrency = Math.max(this.peakConcurrency, this.active);
    res.on('close', () => {
      if (!res.writableEnded) seen.closedEarly = true;
      this.open.delete(res);
      this.active--;
    });
    const reply = await this.reply(seen.n, seen.userText, seen);
    await this.answer(reply, req, res, { api, model: body.model, seen });
  }

  /** Writes one reply; `call` is the completion call it answers (undefined for a response's own routes). */
  private async answer(
    reply: ModelReply,
    req: IncomingMessage,
    res: ServerResponse,
    call: { api: 'chat/completions' | 'responses'; model: string; seen: SeenRequest } | undefined,
  ): Promise<void> {
    const seen = call?.seen ?? { bytesSent: 0 };
    if ('delayMs' in reply && reply.delayMs) await new Promise((r) => setTimeout(r, reply.delayMs));
    if (res.destroyed) return;
    switch (reply.kind) {
      case 'complete':
        if (call === undefined) throw new Error('a complete reply answers a completion call only');
        if (call.api === 'responses') {
          const pieces = reply.content?.match(/\s*\S+/g) ?? [];
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(responseBody({ pieces, inputTokens: 7, model: call.model }, `resp_${call.seen.n}`));
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            id: `chatcmpl-${call.seen.n}`,
            object: 'chat.completion',
            created: Math.floor(Date.now() / 1000),
            model: call.model,
            choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: reply.content } }],
            usage: { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 },
          }),
        );
        return;
      case 'error':
        res
          .writeHead(reply.status, { 'content-type': 'application/json', ...reply.headers })
          .end(JSON.stringify({ error: { message: `fake error ${reply.status}`, type: 'fake', code: null } }));
        return;
      case 'hang':
        return;
      case 'raw':
        res.writeHead(reply.status, reply.headers).end(reply.body);
        return;
      case 'stream': {
        res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
        for (let i = 0; i < reply.events.length; i++) {
          if (reply.breakAfter !== undefined && i === reply.breakAfter) {
            res.destroy();
            return;
          }
          if (reply.gate) await reply.gate(i);
          else if (reply.everyMs && i > 0) await new Promise((r) => setTimeout(r, reply.everyMs));
          if (res.destroyed) return;
          // Flushed one by one, so that a break after them comes after them on the wire too.
          await new Promise<void>((resolve) => res.write(reply.events[i], () => resolve()));
        }
        if (reply.endAfterMs) await new Promise((r) => setTimeout(r, reply.endAfterMs));
        res.end();
        return;
      }
      case 'reset':
        req.socket.destroy();
        return;
      case 'huge': {
        res.writeHead(200, { 'content-type': reply.contentType });
        const prefix = Buffer.from(reply.prefix ?? '');
        const suffix = Buffer.from(reply.suffix ?? '');
        const block = Buffer.alloc(64 * 1024, 'x');
        let paused = reply.pause === undefined;
        const write = async (chunk: Buffer): Promise<boolean> => {
          if (res.destroyed) return false;
          const flowing = res.write(chunk);
          seen.bytesSent += chunk.length;
          reply.onWrite?.();
          if (!flowing) {
            await new Promise<void>((resolve) => {
              const go = (): void => {
                res.off('drain', go).off('close', go);
                resolve();
              };
              res.on('drain', go).on('close', go);
            });
          }
          if (reply.breakAfterBytes !== undefined && seen.bytesSent >= reply.breakAfterBytes) {
            res.destroy();
            return false;
          }
          if (!paused && seen.bytesSent >= reply.pause!.afterBytes) {
            paused = true;
            reply.pause!.reached();
            await reply.pause!.until;
          }
          return !res.destroyed;
        };
        if (!(await write(prefix))) return;
        let fill = reply.bytes - prefix.length - suffix.length;
        while (fill > 0) {
          const chunk = fill >= block.length ? block : block.subarray(0, fill);
          fill -= chunk.length;
          if (!(await write(chunk))) return;
        }
        if (!(await write(suffix))) return;
        res.end();
        return;
      }
      case 'drip': {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"id":"chatcmpl-drip",');
        const timer = setInterval(() => res.write(' '), reply.everyMs);
        res.on('close', () => clearInterval(timer));
        return;
      }
    }
  }
}
