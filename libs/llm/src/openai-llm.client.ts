import { Logger } from '@nestjs/common';
import OpenAI, { APIError, type ClientOptions } from 'openai';
import type { ChatCompletion } from 'openai/resources/chat/completions';
import type { ChatOptions, ChatRequest, LlmClient, ModelCallOptions, SummarizeOptions } from './llm-client.interface';
import { GatewayAuthError } from './llm.errors';
import { sanitizeSummary } from './summary.sanitizer';

export interface OpenAiLlmOptions {
  readonly apiKey: string;
  readonly baseUrl?: string;
  readonly model: string;
  /** The SDK's own per-request timeout: a backstop behind RetryPolicy's wall-clock limit. */
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

/**
 * The SDK fills every option left undefined from the environment: OPENAI_BASE_URL,
 * OPENAI_API_KEY, OPENAI_ADMIN_KEY, OPENAI_ORG_ID, OPENAI_PROJECT_ID,
 * OPENAI_WEBHOOK_SECRET, OPENAI_LOG (at `debug` it prints each request, the
 * user's text included) and OPENAI_CUSTOM_HEADERS. The worker's validated
 * config is its only source, so each option is given explicitly, null where
 * we have nothing. OPENAI_CUSTOM_HEADERS has no option that turns it off; as
 * we set no default headers, whatever the constructor put there came from
 * the environment, and is dropped.
 */
class ConfiguredOpenAI extends OpenAI {
  constructor(options: ClientOptions) {
    super(options);
    this._options = { ...this._options, defaultHeaders: undefined };
  }
}

/**
 * The official SDK with its own retries off (`maxRetries: 0`): RetryPolicy is
 * the one layer that decides about retries, so attempts are counted once.
 * Its warnings and errors go to our logger as their message line only (the
 * SDK's extra arguments can carry request details); info and debug, which
 * carry whole requests and responses, are dropped.
 */
export class OpenAiLlmClient implements LlmClient {
  private readonly logger = new Logger(OpenAiLlmClient.name);
  private readonly client: OpenAI;

  constructor(private readonly options: OpenAiLlmOptions) {
    this.client = new ConfiguredOpenAI({
      apiKey: options.apiKey,
      baseURL: options.baseUrl ?? null, // null: the SDK's default URL, not OPENAI_BASE_URL
      adminAPIKey: null,
      organization: null,
      project: null,
      webhookSecret: null,
      maxRetries: 0,
      timeout: options.requestTimeoutMs,
      logLevel: 'warn',
      logger: {
        error: (message: string) => this.logger.error(`openai: ${message}`),
        warn: (message: string) => this.logger.warn(`openai: ${message}`),
        info: () => undefined,
        debug: () => undefined,
      },
    });
  }

  async summarize(text: string, options: SummarizeOptions): Promise<string> {
    const completion = await this.gatewayErrors(
      this.client.chat.completions.create(
        {
          model: this.options.model,
          messages: [
            { role: 'system', content: SYSTEM_PROMPT },
            { role: 'user', content: text },
          ],
        },
        // Direct calls send no headers of ours, as before the gateway existed.
        this.options.sendTenant ? this.requestOptions(options) : { signal: options.signal },
      ),
    );
    return sanitizeSummary(completion.choices[0]?.message?.content);
  }

  get defaultModel(): string {
    return this.options.model;
  }

  chat(request: ChatRequest, options: ChatOptions): Promise<ChatCompletion> {
    return this.gatewayErrors(
      this.client.chat.completions.create(
        { ...request, model: request.model ?? this.options.model, stream: false },
        this.requestOptions(options),
      ),
    );
  }

  /**
   * On the gateway path, a 401 or 403 that carries `WWW-Authenticate` is the
   * api refusing our internal key (its guard sends `WWW-Authenticate: Bearer`,
   * and has in every release), as a GatewayAuthError: a redelivery, not a
   * dead letter (classifyLlmError). A provider's own 401, relayed by the
   * gateway, never carries the header (the relay passes a fixed list of
   * provider headers, relayedHeaders), so it stays the permanent client
   * error it is when the worker calls the provider directly.
   */
  private async gatewayErrors<T>(call: Promise<T>): Promise<T> {
    if (!this.options.sendTenant) return call;
    try {
      return await call;
    } catch (err) {
      const status: unknown = err instanceof APIError ? err.status : undefined;
      const headers = err instanceof APIError ? (err.headers as Headers | undefined) : undefined;
      if ((status === 401 || status === 403) && headers?.has('www-authenticate'))
        throw new GatewayAuthError(status, (err as Error).message, { cause: err });
      throw err;
    }
  }

  /** Idempotency-Key when given; X-Tenant on the gateway path only (another endpoint has no use for it). */
  private requestOptions({ signal, idempotencyKey, tenant }: ModelCallOptions): {
    signal: AbortSignal;
    headers: Record<string, string>;
  } {
    const headers: Record<string, string> = {};
    if (idempotencyKey !== undefined) headers['Idempotency-Key'] = idempotencyKey;
    if (tenant !== undefined && this.options.sendTenant) headers['X-Tenant'] = tenant;
    return { signal, headers };
  }
}
