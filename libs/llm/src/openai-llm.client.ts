import { type IncomingMessage, type OutgoingHttpHeaders, validateHeaderValue } from 'node:http';
import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import type { ChatCompletion } from 'openai/resources/chat/completions';
import { type NodeHttpTransport, readBody } from '@app/http/node-http.transport';
import { DEFAULT_OPENAI_BASE_URL, providerTransport } from './http-chat-completions.upstream';
import type { ChatOptions, ChatRequest, LlmClient, ModelCallOptions, SummarizeOptions } from './llm-client.interface';
import { GatewayAuthError } from './llm.errors';
import { sanitizeSummary } from './summary.sanitizer';

export interface OpenAiLlmOptions {
  readonly apiKey: string;
  /** The API root; default https://api.openai.com/v1. */
  readonly baseUrl?: string;
  readonly model: string;
  /** Our own per-request timeout: a backstop behind RetryPolicy's wall-clock limit. */
  readonly requestTimeoutMs: number;
  /**
   * The gateway path: each call names its tenant in `X-Tenant` (the api takes
   * it from the internal key only), and the gateway refusing the key is a
   * GatewayAuthError.
   */
  readonly sendTenant?: boolean;
}

const SYSTEM_PROMPT =
  'Summarise the user text in a few sentences of plain prose. Keep names, numbers and dates exact. ' +
  'Do not add anything that is not in the text.';

/** What the backstop timer aborts a request with, told apart from the caller's own abort. */
class BackstopTimeout extends Error {
  constructor() {
    super('the request timed out');
    this.name = 'BackstopTimeout';
  }
}

/**
 * The OpenAI API's `POST /chat/completions`, sent over NodeHttpTransport (the
 * gateway's own client of the provider), not through the `openai` SDK: for
 * the one call shape the worker makes, the SDK and the fetch under it cost
 * about 350 CPU µs a call, a quarter of a job's CPU in the worker bench. What
 * a caller sees is what the SDK gave it: the SDK's types, and its error
 * classes, made by the SDK's own APIError.generate for a non-2xx (status,
 * the `error` object, the headers, so RetryPolicy's classifier reads
 * `x-should-retry` and `Retry-After` as before); APIConnectionError for a
 * connection that failed or broke, APIConnectionTimeoutError when the
 * backstop timer cut it, APIUserAbortError when the caller's signal did.
 * Nothing retries here: RetryPolicy is the one layer that does. Nothing is
 * read from the environment (the SDK's OPENAI_* variables have no effect), and
 * nothing of a request or an answer is logged.
 */
export class OpenAiLlmClient implements LlmClient {
  private readonly transport: NodeHttpTransport;
  private readonly authorization: string;

  constructor(private readonly options: OpenAiLlmOptions) {
    // No cap of its own on connections (the SDK's fetch had none): WORKER_CONCURRENCY bounds the calls in flight.
    this.transport = providerTransport({
      baseUrl: options.baseUrl ?? DEFAULT_OPENAI_BASE_URL,
      maxSockets: Infinity,
    });
    this.authorization = `Bearer ${options.apiKey}`;
  }

  async summarize(text: string, options: SummarizeOptions): Promise<string> {
    const completion = await this.complete(
      {
        model: this.options.model,
        messages: [
          { role: 'system', content: SYSTEM_PROMPT },
          { role: 'user', content: text },
        ],
      },
      // Direct calls send no headers of ours, as before the gateway existed.
      this.options.sendTenant ? options : { signal: options.signal },
    );
    return sanitizeSummary(completion.choices[0]?.message?.content);
  }

  get defaultModel(): string {
    return this.options.model;
  }

  chat(request: ChatRequest, options: ChatOptions): Promise<ChatCompletion> {
    return this.complete({ ...request, model: request.model ?? this.options.model, stream: false }, options);
  }

  /** Ends the kept-alive connections (shutdown, once no call runs). */
  close(): void {
    this.transport.close();
  }

  /** One request, its answer parsed, or the SDK's error class for what went wrong. */
  private async complete(body: object, { signal, idempotencyKey, tenant }: ModelCallOptions): Promise<ChatCompletion> {
    if (signal.aborted) throw new APIUserAbortError();
    const bytes = Buffer.from(JSON.stringify(body));
    const headers: OutgoingHttpHeaders = {
      authorization: this.authorization,
      accept: 'application/json',
      // Said outright: a proxy that compresses anyway is still read (decoded below).
      'accept-encoding': 'identity',
      'content-type': 'application/json',
      'content-length': bytes.length,
      'user-agent': USER_AGENT,
    };
    // Idempotency-Key when given; X-Tenant on the gateway path only (another endpoint has no use for it). A value
    // that cannot be a header (a step's own key with a newline) throws its TypeError here, unretried, as the SDK did.
    if (idempotencyKey !== undefined) headers['idempotency-key'] = headerValue('Idempotency-Key', idempotencyKey);
    if (tenant !== undefined && this.options.sendTenant) headers['x-tenant'] = headerValue('X-Tenant', tenant);
    // One controller for the call: the caller's signal and the backstop timer abort it.
    const call = new AbortController();
    const onAbort = (): void => call.abort(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    const timer = setTimeout(() => call.abort(new BackstopTimeout()), this.options.requestTimeoutMs);
    const failed = (err: unknown): Error => {
      if (call.signal.reason instanceof BackstopTimeout) return new APIConnectionTimeoutError();
      if (signal.aborted) return new APIUserAbortError();
      return new APIConnectionError({ cause: err instanceof Error ? err : new Error(String(err)) });
    };
    let message: IncomingMessage;
    try {
      message = await this.transport.send('POST', 'chat/completions', bytes, headers, call.signal);
    } catch (err) {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      throw failed(err);
    }
    const status = message.statusCode ?? 502;
    let text: string;
    try {
      text = await readText(message);
    } catch (err) {
      // A non-2xx whose body broke off is still that status (the SDK's too): its class decides, not the break.
      if (is2xx(status) || call.signal.aborted) throw failed(err);
      text = err instanceof Error ? err.message : String(err);
    } finally {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
    }
    if (is2xx(status)) {
      try {
        return JSON.parse(text) as ChatCompletion;
      } catch {
        throw new Error(`the model answered ${status} with a body that is not JSON`);
      }
    }
    throw this.statusError(status, text, message);
  }

  /**
   * A non-2xx as the SDK makes it (its makeStatusError): the body's JSON,
   * wrapped in `{ error }` when it has no `error` of its own, else the text
   * as the message. A redirect is not followed (the SDK's fetch followed a
   * 307 or 308): its error names where it points, so OPENAI_BASE_URL can be
   * set to that. On the gateway path, a 401 or 403 that carries
   * `WWW-Authenticate` is the api refusing our internal key (its guard sends
   * `WWW-Authenticate: Bearer`, and has in every release), as a
   * GatewayAuthError: a redelivery, not a dead letter (classifyLlmError). A
   * provider's own 401, relayed by the gateway, never carries the header (the
   * relay passes a fixed list of provider headers, relayedHeaders), so it
   * stays the permanent client error it is when the worker calls the
   * provider directly.
   */
  private statusError(status: number, text: string, message: IncomingMessage): Error {
    const headers = new Headers();
    const raw = message.rawHeaders;
    for (let i = 0; i + 1 < raw.length; i += 2) headers.append(raw[i], raw[i + 1]);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    const error =
      json && typeof json === 'object' && (json as { error?: unknown }).error == null ? { error: json } : json;
    const location = status >= 300 && status < 400 ? headers.get('location') : null;
    const said = location === null ? (json ? undefined : text) : `redirected to ${redacted(location)}, not followed`;
    const err = APIError.generate(status, error as object | undefined, said, headers);
    if (this.options.sendTenant && (status === 401 || status === 403) && headers.has('www-authenticate'))
      return new GatewayAuthError(status, err.message, { cause: err });
    return err;
  }
}

const USER_AGENT = 'llm-workflows';

const is2xx = (status: number): boolean => status >= 200 && status < 300;

/** The value, or a TypeError naming the header it cannot be (node:http's own check, before anything is sent). */
function headerValue(name: string, value: string): string {
  validateHeaderValue(name, value);
  return value;
}

/** A redirect's target without its query or credentials, for an error message. */
function redacted(location: string): string {
  try {
    const url = new URL(location);
    return `${url.origin}${url.pathname}`;
  } catch {
    return 'an address that is not a URL';
  }
}

/** The whole body as UTF-8, decoded if a proxy compressed it anyway (gzip, deflate, br), a byte-order mark dropped. */
async function readText(message: IncomingMessage): Promise<string> {
  const text = decoded(message.headers['content-encoding'], await readBody(message)).toString('utf8');
  return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
}

/** The body as sent, before its Content-Encoding; an encoding it does not know is left as it is. */
function decoded(encoding: string | undefined, bytes: Buffer): Buffer {
  switch (encoding?.trim().toLowerCase()) {
    case 'gzip':
    case 'x-gzip':
      return gunzipSync(bytes);
    case 'deflate':
      return inflateSync(bytes);
    case 'br':
      return brotliDecompressSync(bytes);
    default:
      return bytes;
  }
}
