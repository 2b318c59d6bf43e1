import { connect, createServer, type Server, type Socket } from 'node:net';

export interface TcpProxyOptions {
  /** Every chunk, either way, is held this long before it is passed on (a slow link). */
  readonly delayMs?: number;
}

/**
 * A TCP proxy in front of Redis or PostgreSQL, for tests that need the link to
 * misbehave: slow (every chunk delayed), or black-holed (connections stay
 * open but nothing passes either way, as when a middlebox loses its state;
 * the proxy's kernel still answers TCP keepalive probes). When either side of
 * a connection goes, the other is closed and what was still held is dropped,
 * never delivered late.
 */
export class TcpProxy {
  private readonly pairs = new Set<{ client: Socket; upstream: Socket; frozen: boolean }>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
    private readonly delayMs: number,
  ) {}

  /** Listens on 127.0.0.1:`port` and forwards to the host and port of the URL `target`. */
  static async start(port: number, target: string, options: TcpProxyOptions = {}): Promise<TcpProxy> {
    const { hostname, port: targetPort, protocol } = new URL(target);
    const defaultPort = protocol.startsWith('redis') ? 6379 : 5432;
    // Assigned once the server it needs exists; the server's callback reads it later.
    // eslint-disable-next-line prefer-const
    let proxy!: TcpProxy;
    const server = createServer((client) => proxy.accept(client, hostname, Number(targetPort || defaultPort)));
    proxy = new TcpProxy(server, port, options.delayMs ?? 0);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => resolve());
    });
    return proxy;
  }

  /** `url` (redis:// or postgres://, path and credentials kept) through the proxy. */
  urlFor(url: string): string {
    const through = new URL(url);
    through.hostname = '127.0.0.1';
    through.port = String(this.port);
    return through.toString();
  }

  /** Stops forwarding on every connection open now (the sockets stay open); later ones pass normally. */
  freezeOpenConnections(): number {
    for (const pair of this.pairs) {
      pair.frozen = true;
      pair.client.pause();
      pair.upstream.pause();
    }
    return this.pairs.size;
  }

  async close(): Promise<void> {
    for (const { client, upstream } of this.pairs) {
      client.destroy();
      upstream.destroy();
    }
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket, host: string, port: number): void {
    const upstream = connect(port, host);
    const pair = { client, upstream, frozen: false };
    this.pairs.add(pair);
    const held = new Set<NodeJS.Timeout>();
    const drop = () => {
      this.pairs.delete(pair);
      for (const timer of held) clearTimeout(timer);
      held.clear();
      client.destroy();
      upstream.destroy();
    };
    const forward = (from: Socket, to: Socket) =>
      from.on('data', (chunk: Buffer) => {
        if (pair.frozen) return;
        if (this.delayMs === 0) {
          to.write(chunk);
          return;
        }
        const timer = setTimeout(() => {
          held.delete(timer);
          if (!pair.frozen) to.write(chunk);
        }, this.delayMs);
        held.add(timer);
      });
    for (const socket of [client, upstream]) socket.on('error', drop).on('close', drop);
    forward(client, upstream);
    forward(upstream, client);
  }
}
