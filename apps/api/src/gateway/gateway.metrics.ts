import { Inject, Injectable } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { TokenUsage } from '@app/llm';
import { GATEWAY_OPTIONS, type GatewayOptions } from './gateway.options';
import { GatewayUpstreams } from './gateway-upstreams';
import { TenantTokenLimiter } from '@app/llm';

export const GATEWAY_OUTCOMES = [
  'forwarded',
  'new',
  'replayed',
  'attached',
  'upstream_error',
  'broken_stream',
  'upstream_failed',
  'upstream_malformed',
  'upstream_unreachable',
  'upstream_timeout',
  'caller_gone',
  'cut_by_shutdown',
  'rejected',
] as const;
export type GatewayOutcome = (typeof GATEWAY_OUTCOMES)[number];

/**
 * How one upstream answered a call, at its answer's head: `answered` (2xx), `error_status` (a non-2xx passed
 * through), `fell_back` (a refusal or a 429/5xx that proved nothing was made, so the next upstream was asked),
 * `unreachable`, `timeout`.
 */
export const UPSTREAM_OUTCOMES = ['answered', 'error_status', 'fell_back', 'unreachable', 'timeout'] as const;
export type UpstreamOutcome = (typeof UPSTREAM_OUTCOMES)[number];

/**
 * The gateway's figures: calls by outcome, tokens per tenant (only for calls
 * that went upstream: a replay or an attached duplicate costs none), and the
 * time to the first byte upstream against the caller's.
 */
@Injectable()
export class GatewayMetrics {
  private readonly calls: Counter<'outcome'>;
  private readonly tokens: Counter<'tenant' | 'kind'>;
  private readonly firstByte: Histogram<'side' | 'stream'>;
  private readonly upstreamCalls: Counter<'upstream' | 'outcome'>;
  private readonly tokenRefusals: Counter<'tenant'>;

  constructor(
    registry: Registry,
    @Inject(GATEWAY_OPTIONS) options: GatewayOptions,
    upstreams: GatewayUpstreams,
    limiter: TenantTokenLimiter,
  ) {
    this.calls = new Counter({
      name: 'gateway_calls_total',
      help: 'POST /v1/chat/completions and /v1/responses by outcome: forwarded (no key), new, replayed, attached, upstream_error (passed through), broken_stream, upstream_failed (a stream that reported its own failure), upstream_malformed (a 2xx whole answer that is not a JSON object), upstream_unreachable, upstream_timeout, caller_gone (a call without a key whose caller left), cut_by_shutdown, rejected (the gateway refused it)',
      labelNames: ['outcome'],
      registers: [registry],
    });
    this.tokens = new Counter({
      name: 'gateway_tokens_total',
      help: 'Tokens the provider reported in usage for calls that went upstream, per tenant; kind is prompt or completion',
      labelNames: ['tenant', 'kind'],
      registers: [registry],
    });
    this.firstByte = new Histogram({
      name: 'gateway_first_byte_seconds',
      help: 'Time to the first byte of the answer body: side=upstream from the call to the provider, side=caller from the request arriving',
      labelNames: ['side', 'stream'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    });
    this.upstreamCalls = new Counter({
      name: 'gateway_upstream_calls_total',
      help: 'Calls to each upstream (GATEWAY_UPSTREAMS names) by how it answered: answered (2xx), error_status (a non-2xx passed through), fell_back (refused, or a 429/500/502/503/529 that proved nothing was made: the next upstream was asked), unreachable, timeout',
      labelNames: ['upstream', 'outcome'],
      registers: [registry],
    });
    this.tokenRefusals = new Counter({
      name: 'tenant_token_refusals_total',
      help: 'Gateway calls refused by their tenant token limit (TENANT_TOKEN_LIMITS): 429 tenant_token_limit, or 400 request_exceeds_token_limit',
      labelNames: ['tenant'],
      registers: [registry],
    });
    const limited = options.tenants.filter((tenant) => limiter.limitOf(tenant) !== undefined);
    for (const tenant of limited) this.tokenRefusals.inc({ tenant }, 0);
    new Gauge({
      name: 'tenant_tokens_limit',
      help: "Each limited tenant's token limit per window (TENANT_TOKEN_LIMITS)",
      labelNames: ['tenant', 'window'],
      registers: [registry],
      collect() {
        for (const tenant of limited) {
          const limit = limiter.limitOf(tenant)!;
          this.set({ tenant, window: limit.window }, limit.tokens);
        }
      },
    });
    new Gauge({
      name: 'tenant_tokens_used',
      help: "Tokens (prompt plus completion, from the provider's usage) each limited tenant has settled in its current window; live reservations not included",
      labelNames: ['tenant', 'window'],
      registers: [registry],
      async collect() {
        await Promise.all(
          limited.map(async (tenant) => {
            const used = await limiter.used(tenant).catch(() => undefined);
            if (used !== undefined) this.set({ tenant, window: limiter.limitOf(tenant)!.window }, used);
          }),
        );
      },
    });
    for (const outcome of GATEWAY_OUTCOMES) this.calls.inc({ outcome }, 0);
    // Upstreams are bounded by GATEWAY_UPSTREAMS: every series exists from the start.
    for (const { name } of upstreams.all)
      for (const outcome of UPSTREAM_OUTCOMES) this.upstreamCalls.inc({ upstream: name, outcome }, 0);
    // Tenants are bounded by API_KEYS: every series exists from the start.
    for (const tenant of options.tenants) {
      this.tokens.inc({ tenant, kind: 'prompt' }, 0);
      this.tokens.inc({ tenant, kind: 'completion' }, 0);
    }
  }

  call(outcome: GatewayOutcome): void {
    this.calls.inc({ outcome });
  }

  usage(tenant: string, usage: TokenUsage): void {
    this.tokens.inc({ tenant, kind: 'prompt' }, usage.prompt_tokens);
    this.tokens.inc({ tenant, kind: 'completion' }, usage.completion_tokens);
  }

  tokenRefusal(tenant: string): void {
    this.tokenRefusals.inc({ tenant });
  }

  upstreamCall(upstream: string, outcome: UpstreamOutcome): void {
    this.upstreamCalls.inc({ upstream, outcome });
  }

  firstByteAt(side: 'upstream' | 'caller', stream: boolean, seconds: number): void {
    this.firstByte.observe({ side, stream: String(stream) }, seconds);
  }
}
