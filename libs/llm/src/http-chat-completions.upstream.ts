import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { NodeHttpTransport, type NodeHttpTransportOptions } from '@app/http/node-http.transport';
import {
  abortedBeforeHead,
  type ChatCompletionsUpstream,
  UpstreamUnreachableError,
  type UpstreamRequest,
  type UpstreamResponse,
} from './chat-completions.upstream';

export interface HttpChatCompletionsUpstreamOptions {
  readonly apiKey: string;
  /** The provider's API root, as OPENAI_BASE_URL names it; default https://api.openai.com/v1. */
  readonly baseUrl?: string;
  /** Connections open to the provider at most (kept alive between calls); default 256. */
  readonly maxSockets?: number;
}

export const DEFAULT_OPENAI_BASE_URL = 'https://api.openai.com/v1';

const RELAYED_HEADERS = new Set([
  'content-type',
  'retry-after',
  'retry-after-ms',
  'x-should-retry',
  'x-request-id',
  'openai-processing-ms',
]);

/** The provider's response headers the gateway passes on (UpstreamResponse.headers). */
export function relayedHeaders(headers: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) {
    const value = headers[name];
    if (typeof value === 'string' && (RELAYED_HEADERS.has(name) || name.startsWith('x-ratelimit-'))) out[name] = value;
  }
  return out;
}

/**
 * The provider's chat completions and responses over NodeHttpTransport,
 * bytes relayed as they are: no SDK, no fetch, so a call costs one request
 * on a kept-alive socket and the response's IncomingMessage is the body (its
 * backpressure reaches the provider's socket).
 */
export class HttpChatCompletionsUpstream implements ChatCompletionsUpstream {
  private readonly transport: NodeHttpTransport;
  private readonly authorization: string;

  constructor(options: HttpChatCompletionsUpstreamOptions) {
    this.transport = providerTransport({
      baseUrl: options.baseUrl ?? DEFAULT_OPENAI_BASE_URL,
      ...(options.maxSockets === undefined ? {} : { maxSockets: options.maxSockets }),
    });
    this.authorization = `Bearer ${options.apiKey}`;
  }

  async send({
    method = 'POST',
    path = 'chat/completions',
    body,
    idempotencyKey,
    signal,
  }: UpstreamRequest): Promise<UpstreamResponse> {
    const headers: OutgoingHttpHeaders = {
      authorization: this.authorization,
      accept: 'application/json, text/event-stream',
    };
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = body.length;
    }
    if (idempotencyKey !== undefined) headers['idempotency-key'] = idempotencyKey;
    const message = await this.transport.send(method, path, body, headers, signal);
    return { status: message.statusCode ?? 502, headers: relayedHeaders(message.headers), body: message };
  }

  /** Ends every connection, those in use included: for shutdown, once no call is running. */
  close(): void {
    this.transport.close();
  }
}

/** The transport to a model provider: its failures before the head as the gateway names them (502, 504). */
export function providerTransport(
  options: Pick<NodeHttpTransportOptions, 'baseUrl' | 'maxSockets'>,
): NodeHttpTransport {
  return new NodeHttpTransport({
    ...options,
    unreachable: (cause, sent) => new UpstreamUnreachableError(cause, sent),
    abortedBeforeHead,
  });
}
