import { Inject } from '@nestjs/common';
import type { ChatCompletion, ChatCompletionCreateParamsNonStreaming } from 'openai/resources/chat/completions';

/** What every model call takes. */
export interface ModelCallOptions {
  /** Aborts the call: the wall-clock limit of the attempt, or shutdown. */
  readonly signal: AbortSignal;
  /**
   * Sent as `Idempotency-Key`: the same key for every attempt of one call, so
   * a gateway that recorded the call answers a retry from its record.
   */
  readonly idempotencyKey?: string;
  /** The tenant the call is made for: `X-Tenant` on the gateway path (only the internal key may send it). */
  readonly tenant?: string;
}

/**
 * A summary's call. The gateway path needs its `tenant` (the internal key is
 * refused without one) and wants its `idempotencyKey`; calling the provider
 * directly, summarize sends neither, as it always has.
 */
export type SummarizeOptions = ModelCallOptions;

/** One chat completion's request; `model` defaults to the configured OPENAI_MODEL. */
export type ChatRequest = Omit<ChatCompletionCreateParamsNonStreaming, 'model' | 'stream'> & {
  readonly model?: string;
};

export type ChatOptions = ModelCallOptions;

/** The model, behind the operations the worker needs. */
export interface LlmClient {
  summarize(text: string, options: SummarizeOptions): Promise<string>;
  /** One non-streaming chat completion, no retries of its own (RetryPolicy is the one layer that retries). */
  chat(request: ChatRequest, options: ChatOptions): Promise<ChatCompletion>;
  /** The model a request without one is sent with (OPENAI_MODEL): a call's key hashes the request as sent. */
  readonly defaultModel?: string;
}

export const LlmClient = Symbol('LlmClient');
export const InjectLlmClient = (): ParameterDecorator => Inject(LlmClient);
