import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What the fake model does with one request. */
export type ModelReply =
  | { readonly kind: 'complete'; readonly content: string | null; readonly delayMs?: number }
  | { readonly kind: 'error'; readonly status: number; readonly headers?: Record<string, string>; readonly delayMs?: number }
  /** Accepts the request and never answers. */
  | { readonly kind: 'hang' }
  /** Sends 200 headers, then one byte every `everyMs`, for ever. */
  | { readonly kind: 'drip'; readonly everyMs: number };

export interface SeenRequest {
  readonly n: number;
  readonly model: string;
  readonly userText: string;
  /** The request's headers, names in lower case. */
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  /** Whether the client hung up before the server finished. */
  closedEarly: boolean;
}

/**
 * A local stand-in for the OpenAI API (POST /v1/chat/completions), so the
 * real `openai` SDK and HTTP stack run in tests. `reply` decides per request;
 * when it returns a promise, the request waits for it (a test can change the
 * world at the moment the model is called, before the worker goes on).
 */
export class FakeOpenAiServer {
  readonly requests: SeenRequest[] = [];
  private server: Server | undefined;
  private open = new Set<ServerResponse>();
  private active = 0;
  /** Most requests in progress at the same time. */
  peakConcurrency = 0;

  constructor(public reply: (n: number, text: string) => ModelReply | Promise<ModelReply> = () => ({ kind: 'complete', content: 'A summary.' })) {}

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

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method !== 'POST' || !req.url?.endsWith('/chat/completions')) {
      res.writeHead(404).end();
      return;
    }
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
      model: string;
      messages: { role: string; content: string }[];
    };
    const seen: SeenRequest = {
      n: this.requests.length + 1,
      model: body.model,
      userText: body.messages.find((m) => m.role === 'user')?.content ?? '',
      headers: { ...req.headers },
      closedEarly: false,
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
    const reply = await this.reply(seen.n, seen.userText);
    if ('delayMs' in reply && reply.delayMs) await new Promise((r) => setTimeout(r, reply.delayMs));
    if (res.destroyed) return;
    switch (reply.kind) {
      case 'complete':
        res.writeHead(200, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            id: `chatcmpl-${seen.n}`,
            object: 'chat.completion',
            created: Math.floor(Date.now() / 1000),
            model: body.model,
            choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: reply.content } }],
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
