import {
  Agent as HttpAgent,
  request as httpRequest,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type RequestOptions,
} from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import { TLSSocket } from 'node:tls';

export interface NodeHttpTransportOptions {
  /**
   * Where requests go: an API root (`https://api.openai.com/v1`) whose paths
   * are sent under it, or a whole URL (a webhook's), sent to as it is.
   */
  readonly baseUrl: string;
  /** Connections open at most (kept alive between calls); default 256. */
  readonly maxSockets?: number;
  /** What a failure before the answer's head rejects with; default an UnreachableError. */
  readonly unreachable?: (cause: unknown, requestSent: boolean) => Error;
  /** What an abort before the head rejects with; default the signal's own reason. */
  readonly abortedBeforeHead?: (signal: AbortSignal) => unknown;
}

/** The server could not be reached, or broke off before the answer's head. */
export class UnreachableError extends Error {
  /** The socket error's code (`ECONNREFUSED`, `ECONNRESET`, `ENOTFOUND`, ...), when it had one. */
  readonly code: string | undefined;

  /**
   * @param requestSent whether the request had been written when it failed: then the server may have it (and be
   *   acting on it), and the outcome is unknown rather than "nothing happened".
   */
  constructor(
    cause: unknown,
    readonly requestSent = false,
  ) {
    const said = cause instanceof Error ? cause.message : String(cause);
    super(
      requestSent
        ? `the connection broke after the request was sent, before any answer: ${said}`
        : `the server is unreachable: ${said}`,
      { cause },
    );
    this.name = 'UnreachableError';
    const code = (cause as { code?: unknown } | null)?.code;
    this.code = typeof code === 'string' ? code : undefined;
  }
}

/**
 * Requests to one server over plain node:http(s), on kept-alive sockets: no
 * fetch under it (its Request, web streams and Response cost more than the
 * call itself on a fast server), so a call costs one request and the
 * response's IncomingMessage is the body (its backpressure reaches the
 * server's socket). The gateway's upstream, the worker's model client and
 * the relay's webhook send through it; it owns the one hard case, a request
 * on a kept-alive socket the server closed (`send`).
 */
export class NodeHttpTransport {
  private readonly agent: HttpAgent;
  private readonly request: typeof httpRequest;
  private readonly target: RequestOptions;
  /**
   * Its path with no trailing slash (an API root, for paths under it), its path as given (a whole URL's), and its
   * query (e.g. Azure's `?api-version=`), joined to each path's.
   */
  private readonly root: { readonly path: string; readonly whole: string; readonly search: string };
  private readonly unreachable: (cause: unknown, requestSent: boolean) => Error;
  private readonly abortedBeforeHead: (signal: AbortSignal) => unknown;

  constructor(options: NodeHttpTransportOptions) {
    this.unreachable = options.unreachable ?? ((cause, sent) => new UnreachableError(cause, sent));
    this.abortedBeforeHead = options.abortedBeforeHead ?? ((signal): unknown => signal.reason as unknown);
    const url = new URL(options.baseUrl);
    if (url.protocol !== 'http:' && url.protocol !== 'https:')
      throw new Error(`the URL must be http or https, got "${url.protocol}"`);
    this.root = { path: url.pathname.replace(/\/+$/, ''), whole: url.pathname, search: url.search };
    const agentOptions = { keepAlive: true, maxSockets: options.maxSockets ?? 256 };
    const https = url.protocol === 'https:';
    this.agent = https ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
    this.request = https ? httpsRequest : httpRequest;
    this.target = {
      protocol: url.protocol,
      // An IPv6 literal without its brackets, as node:http wants it.
      hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: url.port === '' ? undefined : Number(url.port),
      agent: this.agent,
      // `https://user:secret@hooks.example/`: Basic credentials, as fetch would not send them (it refuses such URLs).
      ...(url.username || url.password
        ? { auth: `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}` }
        : {}),
    };
  }

  /**
   * Sends `method` to `path` under the API root (a path may carry its own
   * query, which the root's joins; `''` is the root itself) and resolves with
   * the response once its head has arrived; the body is the caller's to read
   * (or destroy). Rejects, before the head, with what `unreachable` makes
   * (refused, reset, DNS, TLS, a malformed answer), or what
   * `abortedBeforeHead` makes of an aborted signal. After the head, an abort
   * destroys the body with the signal's reason.
   */
  send(
    method: string,
    path: string,
    body: Buffer | undefined,
    headers: OutgoingHttpHeaders,
    signal: AbortSignal,
  ): Promise<IncomingMessage> {
    // The signal's own reason, as fetch rejects: whatever the aborter gave (shutdown passes its own).
    // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors
    if (signal.aborted) return Promise.reject(this.abortedBeforeHead(signal));
    const [route, query] = path.split('?', 2);
    const search = [this.root.search.replace(/^\?/, ''), query ?? ''].filter((q) => q !== '').join('&');
    // The URL itself as given (a webhook's `/hook/` is not its `/hook`), or a route under the root.
    const under = route === '' ? this.root.whole : `${this.root.path}/${route}`;
    return this.attempt(method, `${under}${search ? `?${search}` : ''}`, body, headers, signal);
  }

  /** Ends every connection, those in use included: for shutdown, once no call is running. */
  close(): void {
    this.agent.destroy();
  }

  /**
   * One request, sent again on a new connection only when it provably never
   * left. A kept-alive socket the server closed while it sat idle is the
   * one case to cover (node:http's documentation advises a retry on
   * ECONNRESET for a reused socket): its FIN may still be unread when the
   * agent hands the socket out. So on a reused socket nothing is written
   * until one turn of the event loop has read what was waiting on it; a
   * socket that turns out ended or destroyed then has carried no byte of the
   * request, and the request goes on a new connection. Every other failure
   * before the head, once the request was written, is an
   * unreachable error whose `requestSent` says the server may have
   * it: resending it then would run (and bill) the call twice, as the
   * server may have been at work for minutes (a model generating) when it reset.
   */
  private attempt(
    method: string,
    path: string,
    body: Buffer | undefined,
    headers: OutgoingHttpHeaders,
    signal: AbortSignal,
  ): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const req = this.request({ ...this.target, method, path, headers });
      let res: IncomingMessage | undefined;
      let written = false;
      // A reused socket is connected; a new one only once its handshake is done (bytes written before wait in Node).
      let connected = false;
      let settled = false;
      const onAbort = (): void => {
        if (res !== undefined) {
          // The body's iteration throws the reason.
          res.destroy(signal.reason as Error);
        } else {
          settled = true;
          req.destroy();
          // The signal's own reason, as above.
          // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors
          reject(this.abortedBeforeHead(signal));
        }
      };
      signal.addEventListener('abort', onAbort, { once: true });
      const forget = (): void => signal.removeEventListener('abort', onAbort);
      const write = (): void => {
        written = true;
        if (body === undefined) req.end();
        else req.end(body);
      };
      /** Nothing of the request was written: it goes on another connection. */
      const again = (): void => {
        settled = true;
        forget();
        req.destroy();
        resolve(this.attempt(method, path, body, headers, signal));
      };

      req.once('socket', (socket: Socket) => {
        if (!req.reusedSocket) {
          socket.once(socket instanceof TLSSocket ? 'secureConnect' : 'connect', () => (connected = true));
          write();
          return;
        }
        connected = true;
        // A FIN or reset that arrived while the socket was idle is read in this turn's poll phase.
        setImmediate(() => {
          if (settled || signal.aborted) return;
          if (socket.destroyed || socket.readableEnded || !socket.writable) again();
          else write();
        });
      });
      req.once('response', (message: IncomingMessage) => {
        res = message;
        settled = true;
        // A break before anyone reads would otherwise be an uncaught 'error';
        // the body's iterator still sees it (the stream keeps it as `errored`).
        message.on('error', () => undefined);
        message.once('close', forget);
        resolve(message);
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        // After the head a break reaches the caller through the body.
        if (res !== undefined || settled) return;
        if (signal.aborted) {
          forget();
          return;
        }
        if (!written && req.reusedSocket) {
          again();
          return;
        }
        settled = true;
        forget();
        reject(this.unreachable(err, written && connected));
      });
    });
  }
}

/**
 * The whole body of an answer `send` resolved with; rejects with the stream's error if it breaks, or is destroyed
 * (the signal's abort), before its end.
 */
export function readBody(message: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    message.on('data', (chunk: Buffer) => chunks.push(chunk));
    message.once('end', () => resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)));
    message.once('error', reject);
    message.once('close', () => {
      if (!message.complete) reject(message.errored ?? new Error('the connection closed before the answer ended'));
    });
  });
}
