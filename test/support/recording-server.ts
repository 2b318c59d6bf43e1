import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/** One request as a RecordingServer received it. */
export interface SeenRequest {
  readonly method: string | undefined;
  readonly url: string | undefined;
  readonly headers: IncomingMessage['headers'];
  /** The body's bytes, whole. */
  readonly body: Buffer;
  readonly socket: Socket;
}

/**
 * A local HTTP server playing a provider outside our walls: it records every
 * request, body included, and `handle` answers each once its body has
 * arrived. `connections` are the sockets it accepted, in order.
 */
export class RecordingServer {
  readonly seen: SeenRequest[] = [];
  readonly connections: Socket[] = [];
  private readonly server: Server = createServer((req, res) => void this.receive(req, res));

  constructor(public handle: (res: ServerResponse, seen: SeenRequest) => unknown = (res) => res.writeHead(500).end()) {}

  async start(): Promise<this> {
    this.server.on('connection', (socket: Socket) => this.connections.push(socket));
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return this;
  }

  /** `http://127.0.0.1:<port>` followed by `path`. */
  url(path = ''): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}${path}`;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private async receive(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const seen: SeenRequest = {
      method: req.method,
      url: req.url,
      headers: req.headers,
      body: Buffer.concat(chunks),
      socket: req.socket,
    };
    this.seen.push(seen);
    await this.handle(res, seen);
  }
}
