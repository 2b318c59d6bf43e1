import { Inject } from '@nestjs/common';

/**
 * The provider's APIs the gateway relays, as paths under its API root
 * (OPENAI_BASE_URL): the two that make completions, and a response's own
 * (`responses/<id>`, `responses/<id>/cancel`, with a query for a stream).
 */
export type UpstreamPath = 'chat/completions' | 'responses' | `responses/${string}`;

export interface UpstreamRequest {
  /** `POST` when unset. */
  readonly method?: 'POST' | 'GET' | 'DELETE';
  /** Which API: `chat/completions` when unset. */
  readonly path?: UpstreamPath;
  /** The request body exactly as the client sent it; none for GET and DELETE. */
  readonly body?: Buffer;
  /** The same body, parsed (the fake model reads it; the HTTP upstream ignores it). */
  readonly json?: unknown;
  /** Sent as the provider's `Idempotency-Key` header: the gateway's key for the operation. */
  readonly idempotencyKey?: string;
  /** Ends the call: the gateway's timeout, shutdown, or (for a call without a key) its caller leaving. */
  readonly signal: AbortSignal;
}

export interface UpstreamResponse {
  readonly status: number;
  /**
   * Lower-case names; only what is relayed: content-type, retry-after,
   * retry-after-ms, x-should-retry, x-request-id, openai-processing-ms, x-ratelimit-*.
   */
  readonly headers: Readonly<Record<string, string>>;
  /**
   * The raw body bytes as they arrive, to be read once; the iteration throws
   * if the connection breaks or the signal aborts. A slow reader slows the
   * provider's socket; leaving the loop early closes it.
   */
  readonly body: AsyncIterable<Buffer>;
}

/** The provider's `POST /chat/completions` and `POST /responses`, bytes in and bytes out. */
export interface ChatCompletionsUpstream {
  /**
   * Resolves once the response head has arrived. Throws
   * UpstreamUnreachableError (no head: refused, reset, DNS, TLS, a malformed
   * answer), UpstreamTimeoutError (the signal aborted with a TimeoutError
   * reason before the head), or the signal's reason for any other abort.
   */
  send(request: UpstreamRequest): Promise<UpstreamResponse>;
}

export const ChatCompletionsUpstream = Symbol('ChatCompletionsUpstream');
export const InjectChatCompletionsUpstream = (): ParameterDecorator => Inject(ChatCompletionsUpstream);

/** The provider could not be reached, or broke off before the response head (the gateway's 502). */
export class UpstreamUnreachableError extends Error {
  /** The socket error's code (`ECONNREFUSED`, `ECONNRESET`, `ENOTFOUND`, ...), when it had one. */
  readonly code: string | undefined;

  /**
   * @param requestSent whether the request had been written when it failed:
   *   then the provider may have it (and be running it), and the outcome is
   *   unknown rather than "nothing happened".
   */
  constructor(
    cause: unknown,
    readonly requestSent = false,
  ) {
    super(
      requestSent
        ? `the connection to the model provider broke after the request was sent, before any answer: ${cause instanceof Error ? cause.message : String(cause)}`
        : `the model provider is unreachable: ${cause instanceof Error ? cause.message : String(cause)}`,
      { cause },
    );
    this.name = 'UpstreamUnreachableError';
    const code = (cause as { code?: unknown } | null)?.code;
    this.code = typeof code === 'string' ? code : undefined;
  }
}

/** The call's time ran out before the provider's response head arrived (the gateway's 504). */
export class UpstreamTimeoutError extends Error {
  constructor(cause?: unknown) {
    super('the model provider did not answer in time', { cause });
    this.name = 'UpstreamTimeoutError';
  }
}

/**
 * What `send()` rejects with once its signal has aborted before the head:
 * a TimeoutError reason (AbortSignal.timeout) is the upstream's timeout,
 * anything else (shutdown) is passed on as it is. The name is compared, not
 * the class: DOMException may come from another realm.
 */
export function abortedBeforeHead(signal: AbortSignal): unknown {
  const reason: unknown = signal.reason;
  return (reason as { name?: unknown } | null)?.name === 'TimeoutError' ? new UpstreamTimeoutError(reason) : reason;
}
