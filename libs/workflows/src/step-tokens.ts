import { APIError } from 'openai';
import { parseRetryAfter } from '@app/client';
import { type ChatRequest, type TenantTokenLimiter, worstCaseTokens } from '@app/llm';
import type { ChatCompletion } from 'openai/resources/chat/completions';

/** The step's tenant token limit refused its model call: it waits `retryAfterMs` (not a failed attempt). */
export class TokenLimitWait extends Error {
  constructor(readonly retryAfterMs: number) {
    super(`the tenant's token limit has no room for this model call for ${Math.ceil(retryAfterMs / 1000)} s`);
    this.name = 'TokenLimitWait';
  }
}

/** A model call whose worst case alone is over the tenant's whole limit: it can never run (not retried). */
export class TokenLimitTooLarge extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TokenLimitTooLarge';
  }
}

/**
 * The gateway's 429 `tenant_token_limit` (the worker's calls through it, `LLM_GATEWAY_URL`), as the wait it
 * asks for; anything else is undefined.
 */
export function tokenLimitWaitOf(err: unknown): TokenLimitWait | undefined {
  if (err instanceof TokenLimitWait) return err;
  if (!(err instanceof APIError) || err.status !== 429 || err.code !== 'tenant_token_limit') return undefined;
  const headers = err.headers as Headers | undefined;
  return new TokenLimitWait(Math.max(1000, (headers && parseRetryAfter(headers)) ?? 1000));
}

/** A model call's worst case (the gateway's estimate) for a chat request as the worker sends it. */
export function stepCallWorstCase(request: ChatRequest): number {
  return worstCaseTokens(Buffer.byteLength(JSON.stringify(request)), request);
}

/** What a completion used, prompt plus completion, when the provider said. */
export function tokensUsed(completion: ChatCompletion): number | undefined {
  const usage = completion.usage;
  return usage ? usage.prompt_tokens + usage.completion_tokens : undefined;
}

/**
 * The worker's own reservation for a step's model call when it calls the
 * provider directly (TENANT_TOKEN_LIMITS in the worker; through the gateway,
 * the gateway reserves). Undefined without a limit for the tenant; throws
 * TokenLimitWait when the call does not fit now.
 */
export async function reserveStepTokens(
  limiter: TenantTokenLimiter | undefined,
  tenant: string,
  worstCase: number,
  id: string,
): Promise<((tokens: number) => Promise<void>) | undefined> {
  if (limiter === undefined) return undefined;
  const reserved = await limiter.reserve(tenant, worstCase, id);
  if (reserved === undefined) return undefined;
  if (reserved.outcome === 'reserved') return (tokens) => reserved.settle(tokens);
  // Over the whole limit: no window will ever fit it (the gateway's 400 request_exceeds_token_limit).
  if (reserved.outcome === 'too_large')
    throw new TokenLimitTooLarge(
      `this model call may use up to ${worstCase} tokens, more than the tenant's whole limit of ${reserved.limit.tokens} per ${reserved.limit.window}`,
    );
  throw new TokenLimitWait(reserved.retryAfterS * 1000);
}
