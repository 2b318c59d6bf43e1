import { parseTenantTokenLimits, type TenantTokenLimits } from './tenant-token-limits';
import { ConfigFieldError, type Env, type EnvField, env } from '@app/config';
import { type LlmProvider, llmProviderEnv } from './llm-provider.settings';

/** The shortest INTERNAL_API_KEY: it opens every tenant's gateway calls, so it must resist guessing everywhere. */
export const MIN_INTERNAL_API_KEY_LENGTH = 16;
/** In production, as ADMIN_API_KEY: a key that names any tenant is worth at least the admin key's length. */
export const MIN_PRODUCTION_INTERNAL_API_KEY_LENGTH = 24;

/**
 * INTERNAL_API_KEY, read by the api (which accepts it) and the worker (which
 * sends it); one field so that both apps validate and document it alike. The
 * value never appears in an error message, as no secret does.
 */
export const internalApiKeyEnv = {
  internalApiKey: env.custom(
    'INTERNAL_API_KEY',
    (raw, all): string | undefined => {
      if (raw === undefined) return undefined;
      if (!/^[\x21-\x7e]+$/.test(raw)) throw new ConfigFieldError('must be printable ASCII without spaces');
      if (raw.length < MIN_INTERNAL_API_KEY_LENGTH)
        throw new ConfigFieldError(`must be at least ${MIN_INTERNAL_API_KEY_LENGTH} characters`);
      if (all.NODE_ENV === 'production' && raw.length < MIN_PRODUCTION_INTERNAL_API_KEY_LENGTH)
        throw new ConfigFieldError(
          `must be at least ${MIN_PRODUCTION_INTERNAL_API_KEY_LENGTH} characters in production`,
        );
      return raw;
    },
    {
      docDefault: 'unset',
      describe:
        "the worker's key to the api's gateway, the same on both, 16+ characters (24+ in production), a secret in every environment " +
        "(no demo value). Set (with `LLM_GATEWAY_URL` on the worker): the worker's model calls go through the " +
        "gateway, authenticated with this key and naming the run's tenant in `X-Tenant` (which no other key may " +
        "send), so a worker killed mid-call is answered from the gateway's record without a second upstream call. " +
        'The api refuses it without `X-Tenant`, and stops the start when it equals a tenant key or `ADMIN_API_KEY`. ' +
        'Unset: the worker calls the provider directly, and a call whose worker was killed is made (and paid) ' +
        'again on redelivery',
    },
  ),
};

const gatewayUrl = env.optionalUrl('LLM_GATEWAY_URL', ['http:', 'https:']);

/**
 * LLM_GATEWAY_URL is the api's base URL and nothing more: the client adds
 * `/v1/chat/completions`, so a path (`http://api:3000/v1`) would post to
 * `/v1/v1/...` and every call would fail with a 404; a query, fragment or
 * credentials would be sent, or dropped, on every call without anyone having
 * meant it. The message never echoes the value (it could carry a password).
 */
function baseUrlOnly(value: string): void {
  const url = new URL(value);
  const extras = [
    url.pathname !== '/' ? 'a path' : undefined,
    url.search !== '' ? 'a query' : undefined,
    url.hash !== '' ? 'a fragment' : undefined,
    url.username !== '' || url.password !== '' ? 'credentials' : undefined,
  ].filter((e): e is string => e !== undefined);
  if (extras.length > 0)
    throw new ConfigFieldError(
      `must be the api's base URL alone, e.g. http://api:3000 (without /v1: the client adds it), but has ${extras.join(', ')}`,
    );
}

/**
 * LLM_GATEWAY_URL (the worker): the api's base URL. Meaningful only with
 * INTERNAL_API_KEY, so one without the other stops the start: a worker that
 * silently called the provider directly would lose the guarantee the operator
 * meant to turn on, and one with a key and nowhere to send it is a typo.
 */
export const llmGatewayEnv = {
  llmGatewayUrl: {
    ...gatewayUrl,
    parse: (raw: string | undefined, all: Readonly<Record<string, string | undefined>>): string | undefined => {
      const url = gatewayUrl.parse(raw, all);
      if (url !== undefined) baseUrlOnly(url);
      const keySet = (all.INTERNAL_API_KEY?.trim() ?? '') !== '';
      if (url !== undefined && !keySet)
        throw new ConfigFieldError(
          'is set but INTERNAL_API_KEY is not: set both (calls through the gateway) or neither',
        );
      if (url === undefined && keySet)
        throw new ConfigFieldError(
          'is unset but INTERNAL_API_KEY is set: set both (calls through the gateway) or neither',
        );
      // The URL's own origin: with nothing else allowed, that is the base URL with no trailing slash.
      return url === undefined ? undefined : new URL(url).origin;
    },
    doc: {
      default: 'unset',
      describe:
        "the api's base URL (e.g. `http://api:3000`, without `/v1`: no path, query, fragment or credentials), " +
        "`http://` or `https://`: where the worker's " +
        'model calls go with `INTERNAL_API_KEY`; set both or neither. With both, the worker ignores `LLM_PROVIDER`, ' +
        "`OPENAI_API_KEY` and `OPENAI_BASE_URL` (the api's gateway holds the provider); `OPENAI_MODEL` is still " +
        'the model it asks for',
    },
  } satisfies EnvField<string | undefined>,
};

/**
 * The provider variables the worker does not use in gateway mode: the api's
 * gateway holds the provider and its key, and reserves for the tenants'
 * token limits. OPENAI_MODEL is not among them (it is still the model the
 * worker asks for).
 */
export const GATEWAY_MODE_UNUSED_VARIABLES = [
  'LLM_PROVIDER',
  'OPENAI_API_KEY',
  'OPENAI_BASE_URL',
  'TENANT_TOKEN_LIMITS',
] as const;

/** Whether LLM_GATEWAY_URL is set (its own field checks it and INTERNAL_API_KEY). */
const gatewayMode = (all: Env): boolean => (all.LLM_GATEWAY_URL?.trim() ?? '') !== '';

/**
 * llmProviderEnv for an app that may call through the gateway (the worker):
 * with LLM_GATEWAY_URL set, the GATEWAY_MODE_UNUSED_VARIABLES are neither
 * read nor checked, so a worker in gateway mode needs no OPENAI_API_KEY under
 * LLM_PROVIDER=openai, and holds no provider key it would not use. Its
 * provider is then `openai`, which is what it speaks (the OpenAI API, at the
 * gateway). The docs are llmProviderEnv's: a variable's row is one for every
 * app, and LLM_GATEWAY_URL's says what gateway mode ignores.
 */
/**
 * TENANT_TOKEN_LIMITS for an app whose model calls may go to the provider
 * directly (the worker): read only then; through the gateway, the api's
 * reserves for them.
 */
export const tenantTokenLimitsUnlessGatewayEnv = {
  tenantTokenLimits: env.custom(
    'TENANT_TOKEN_LIMITS',
    (raw, all): TenantTokenLimits | undefined => (gatewayMode(all) ? undefined : parseTenantTokenLimits(raw)),
    {
      docDefault: 'unset: no limit',
      describe:
        '`tenant=tokens/window` entries, comma separated, window `Ns`, `Nm`, `Nh` or `Nd` (e.g. `t1=200000/1d,t2=5000/1m`); ' +
        '`*=...` applies to every tenant not named. A gateway call reserves its worst case in Redis before it goes ' +
        'upstream (`429` `tenant_token_limit` when it does not fit) and settles to the usage when it ends; a ' +
        "workflow step's model call waits for the window instead; fixed windows (docs/clients.md, " +
        '"Tenants\' token limits"). The worker reads it only when it calls the provider itself (the api\'s ' +
        'gateway reserves for it otherwise), with the same value as the api. A malformed entry stops the start, ' +
        'named by its position',
    },
  ),
};

export const llmProviderUnlessGatewayEnv = {
  ...llmProviderEnv,
  llmProvider: {
    ...llmProviderEnv.llmProvider,
    parse: (raw: string | undefined, all: Env): LlmProvider =>
      gatewayMode(all) ? 'openai' : llmProviderEnv.llmProvider.parse(raw, all),
  } satisfies EnvField<LlmProvider>,
  openaiApiKey: {
    ...llmProviderEnv.openaiApiKey,
    parse: (raw: string | undefined, all: Env): string | undefined =>
      gatewayMode(all) ? undefined : llmProviderEnv.openaiApiKey.parse(raw, all),
  } satisfies EnvField<string | undefined>,
  openaiBaseUrl: {
    ...llmProviderEnv.openaiBaseUrl,
    parse: (raw: string | undefined, all: Env): string | undefined =>
      gatewayMode(all) ? undefined : llmProviderEnv.openaiBaseUrl.parse(raw, all),
  } satisfies EnvField<string | undefined>,
};
