import { httpServerEnv } from '@app/http';
import { tracingEnv } from '@app/tracing';
import {
  commonEnv,
  redisDurabilityEnv,
  ConfigFieldError,
  ConfigOf,
  type Env,
  env,
  parseConfig,
  processEnv,
} from '@app/config';
import { internalApiKeyEnv, llmProviderEnv } from '@app/llm';
import { QUERY_TIMEOUT_MS } from '@app/persistence';
import { jobStreamPartitionsEnv } from '@app/summary-queue';
import { parseApiKeys } from './auth/api-keys';
import { GATEWAY_SETTLE_MS } from './gateway/gateway.options';
import { parseGatewayUpstreams } from './gateway/gateway-upstreams';
import { parseTenantTokenLimits, tenantTokenLimitsUnlessGatewayEnv, type TenantTokenLimits } from '@app/llm';

/**
 * A limit for a tenant API_KEYS does not name would limit nobody (a typo
 * leaves the tenant meant unlimited): it stops the start. API_KEYS that do
 * not parse are reported on their own.
 */
function knownTenantsOnly(limits: TenantTokenLimits | undefined, all: Env): TenantTokenLimits | undefined {
  if (limits === undefined) return undefined;
  let tenants: Set<string>;
  try {
    tenants = new Set(parseApiKeys(all.API_KEYS, all.NODE_ENV === 'production').map((e) => e.tenant));
  } catch {
    return limits;
  }
  const unknown = [...limits.byTenant.keys()].filter((t) => !tenants.has(t));
  if (unknown.length > 0) throw new ConfigFieldError(`names tenants API_KEYS does not have: ${unknown.join(', ')}`);
  return limits;
}

/** Every variable the api reads (INTERFACE.md); the manifests are checked against it. */
export const apiEnvSchema = {
  ...commonEnv,
  ...redisDurabilityEnv,
  ...httpServerEnv,
  ...tracingEnv,
  port: env.int('PORT', 3000, { min: 0, max: 65535 }),
  apiKeys: env.custom('API_KEYS', (raw, all) => parseApiKeys(raw, all.NODE_ENV === 'production'), {
    docDefault: '`demo:demo-key` outside production',
    describe:
      '`tenant:key` pairs, comma separated; a tenant may have several keys (rotation); in production required, ' +
      'keys of at least 16 characters. An entry with a second `:` (ambiguous), an empty tenant or key, or a key ' +
      'given to two tenants stops the start; the message names the entry by its position, never its parts ' +
      '(one written `key:tenant` would put the key where the tenant goes)',
  }),
  adminApiKey: env.custom('ADMIN_API_KEY', (raw, all) => parseAdminKey(raw, all), {
    docDefault: '`demo-admin-key` outside production',
    describe:
      "the admin endpoints' key, never a tenant's; in production 24+ characters, " +
      'and unset turns the admin endpoints off',
  }),
  internalApiKey: {
    ...internalApiKeyEnv.internalApiKey,
    parse: (raw: string | undefined, all: Env): string | undefined =>
      distinctInternalKey(internalApiKeyEnv.internalApiKey.parse(raw, all), all),
  },
  idempotencyLockTtlMs: env.secondsAsMs(
    'IDEMPOTENCY_LOCK_TTL_S',
    10,
    { min: 1, max: 3600 },
    {
      describe:
        "the lease on a running request's key, renewed every third of it while the request runs: " +
        'how long a request that died (a killed pod) holds its key, not a limit on handlers',
    },
  ),
  idempotencyResultTtlMs: env.secondsAsMs('IDEMPOTENCY_RESULT_TTL_S', 86400, { min: 60, max: 30 * 86400 }),
  ...jobStreamPartitionsEnv,
  idempotencyStore: env.oneOf('IDEMPOTENCY_STORE', 'redis', ['redis', 'postgres'], {
    describe:
      'where the idempotency records live: `redis`, or `postgres` (the `idempotency_keys` table, swept in ' +
      'batches; streamed answers in `idempotency_frames`, followed through one LISTEN connection per api process); ' +
      "the gateway's own records go with them (`gateway_upstream_pins`, `gateway_responses`)",
  }),
  ...llmProviderEnv,
  gatewayUpstreams: env.custom('GATEWAY_UPSTREAMS', parseGatewayUpstreams, {
    docDefault: 'unset: one upstream, from `LLM_PROVIDER` / `OPENAI_BASE_URL` / `OPENAI_API_KEY`',
    describe:
      'the gateway\'s upstreams, a JSON array in fallback order of `{"name", "base_url", "api_key_env", "models"}` ' +
      '(`models`: names, or prefixes ending in `*`); a request goes to the first that lists its model, and to the ' +
      'next only when the failure proves nothing was made (refused; `429`, `500`, `502`, `503`, `529`). Not JSON, ' +
      'a repeated name or an unset `api_key_env` stops the start, naming the entry, never a URL or key',
  }),
  // The same row as the worker's: the docs' reference has one row per variable.
  tenantTokenLimits: {
    ...tenantTokenLimitsUnlessGatewayEnv.tenantTokenLimits,
    parse: (raw: string | undefined, all: Env): TenantTokenLimits | undefined =>
      knownTenantsOnly(parseTenantTokenLimits(raw), all),
  },
  gatewayTimeoutMs: env.secondsAsMs(
    'GATEWAY_TIMEOUT_S',
    300,
    { min: 1, max: 3600 },
    {
      describe:
        'the longest one upstream call of the gateway may take, a whole stream included; ' +
        'past it the caller gets `504` (or, mid-stream, the error event) and nothing is stored',
    },
  ),
  /**
   * POST /v1/refunds's payment provider: its base URL, or unset for the
   * built-in fake (the quick start). Like LLM_PROVIDER's fake, the fake is
   * allowed in production too (docker-compose.yml runs NODE_ENV=production);
   * the manifests are where an environment says which provider it pays with.
   */
  paymentsUrl: env.optionalUrl('PAYMENTS_URL', ['http:', 'https:'], {
    docDefault: 'unset: a built-in fake provider that pays in memory (refuses amounts over 1,000,000 minor units)',
    describe:
      "the payment provider's base URL for `POST /v1/refunds` (`http://` or `https://`); the fake is for the " +
      'quick start, and production allows it too, so set this wherever refunds are real',
  }),
  /**
   * The longest one call to the payment provider may take; a refund request makes up to three
   * (REFUND_PROVIDER_CALLS).
   */
  paymentsTimeoutMs: env.secondsAsMs(
    'PAYMENTS_TIMEOUT_S',
    10,
    { min: 1, max: 120 },
    {
      describe:
        "the longest one call to the payment provider may take, 1 to 120; past it the refund's outcome is " +
        "unknown (`503`). A refund request makes up to three calls, so the api's drain on SIGTERM grows by " +
        'three times this',
    },
  ),
};

export type ApiConfig = ConfigOf<typeof apiEnvSchema>;

/** On SIGTERM, how long the gateway's running calls get to finish before they are cut. */
export const gatewayDrainMs = (config: ApiConfig): number => config.httpRequestTimeoutMs;

/**
 * The provider calls one refund request may make, each up to
 * PAYMENTS_TIMEOUT_S: the lookup of a key whose earlier request died, the
 * payout when that found nothing, and the lookup that settles a payout left
 * unknown.
 */
export const REFUND_PROVIDER_CALLS = 3;

/**
 * The longest a request's handler may wait once its body has arrived: a
 * refund's, REFUND_PROVIDER_CALLS calls of PAYMENTS_TIMEOUT_S plus
 * PostgreSQL's query timeout. Every other route waits on PostgreSQL at most
 * its query timeout (Redis commands time out in 2 s), which is less.
 */
export const longestHandlerMs = (config: ApiConfig): number =>
  REFUND_PROVIDER_CALLS * config.paymentsTimeoutMs + QUERY_TIMEOUT_MS;

/**
 * The longest SIGTERM-to-exit of the api. First the gateway lets its running
 * calls finish (gatewayDrainMs), then cuts them (they get GATEWAY_SETTLE_MS
 * to free their keys); the server still accepts meanwhile. Then it stops
 * accepting and waits for the requests in flight: one may still be arriving
 * (up to HTTP_REQUEST_TIMEOUT_S), then its handler waits up to
 * longestHandlerMs. A refund in flight when SIGTERM arrives runs in parallel
 * with the gateway's drain, so the last term covers it too, the one accepted
 * just before the server stops included: with the defaults 30 + 2 + 30 +
 * (3 x 10 + 20) = 112 s. The manifests' grace periods are checked against it.
 */
export const apiDrainMs = (config: ApiConfig): number =>
  gatewayDrainMs(config) + GATEWAY_SETTLE_MS + config.httpRequestTimeoutMs + longestHandlerMs(config);

/** The api's whole configuration, validated once at boot; throws naming every bad variable. */
export function loadApiConfig(source: Env = processEnv()): ApiConfig {
  return parseConfig(apiEnvSchema, source);
}

const DEMO_ADMIN_KEY = 'demo-admin-key';

/** The tenant keys, or none when API_KEYS itself is invalid (it is reported under its own name). */
function tenantKeysOf(all: Env): string[] {
  try {
    return parseApiKeys(all.API_KEYS, all.NODE_ENV === 'production').map((e) => e.key);
  } catch {
    return [];
  }
}

/**
 * INTERNAL_API_KEY, on the api's side: a key that is also a tenant's would
 * make that tenant's key able to name any tenant in X-Tenant, and one equal
 * to the admin key would hand the admin endpoints to every worker.
 */
function distinctInternalKey(key: string | undefined, all: Env): string | undefined {
  if (key === undefined) return undefined;
  if (tenantKeysOf(all).includes(key)) throw new ConfigFieldError('must differ from every tenant key in API_KEYS');
  if (all.ADMIN_API_KEY?.trim() === key) throw new ConfigFieldError('must differ from ADMIN_API_KEY');
  return key;
}

/**
 * ADMIN_API_KEY: the one key of the admin endpoints, never a tenant's.
 * Outside production `demo-admin-key` when unset; in production unset means
 * the admin endpoints are off.
 */
function parseAdminKey(raw: string | undefined, all: Env): string | undefined {
  const production = all.NODE_ENV === 'production';
  const key = raw ?? (production ? undefined : DEMO_ADMIN_KEY);
  if (key === undefined) return undefined;
  if (!/^[\x21-\x7e]+$/.test(key)) throw new ConfigFieldError('must be printable ASCII without spaces');
  if (production && key.length < 24) throw new ConfigFieldError('must be at least 24 characters in production');
  if (tenantKeysOf(all).includes(key)) throw new ConfigFieldError('must differ from every tenant key in API_KEYS');
  return key;
}
