import { ConfigFieldError, type EnvField, env } from '@app/config';

/** The shortest INTERNAL_API_KEY: it opens every tenant's gateway calls, so it must resist guessing everywhere. */
export const MIN_INTERNAL_API_KEY_LENGTH = 16;

/**
 * INTERNAL_API_KEY, read by the api (which accepts it) and the worker (which
 * sends it); one field so that both apps validate and document it alike. The
 * value never appears in an error message, as no secret does.
 */
export const internalApiKeyEnv = {
  internalApiKey: env.custom(
    'INTERNAL_API_KEY',
    (raw): string | undefined => {
      if (raw === undefined) return undefined;
      if (!/^[\x21-\x7e]+$/.test(raw)) throw new ConfigFieldError('must be printable ASCII without spaces');
      if (raw.length < MIN_INTERNAL_API_KEY_LENGTH)
        throw new ConfigFieldError(`must be at least ${MIN_INTERNAL_API_KEY_LENGTH} characters`);
      return raw;
    },
    {
      docDefault: 'unset',
      describe:
        "the worker's key to the api's gateway, the same on both, 16+ characters, a secret in every environment " +
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
      const keySet = (all.INTERNAL_API_KEY?.trim() ?? '') !== '';
      if (url !== undefined && !keySet)
        throw new ConfigFieldError(
          'is set but INTERNAL_API_KEY is not: set both (calls through the gateway) or neither',
        );
      if (url === undefined && keySet)
        throw new ConfigFieldError(
          'is unset but INTERNAL_API_KEY is set: set both (calls through the gateway) or neither',
        );
      return url === undefined ? undefined : url.replace(/\/+$/, '');
    },
    doc: {
      default: 'unset',
      describe:
        "the api's base URL (e.g. `http://api:3000`, without `/v1`), `http://` or `https://`: where the worker's " +
        'model calls go with `INTERNAL_API_KEY`; set both or neither. With both, the worker ignores `LLM_PROVIDER`, ' +
        "`OPENAI_API_KEY` and `OPENAI_BASE_URL` (the api's gateway holds the provider); `OPENAI_MODEL` is still " +
        'the model it asks for',
    },
  } satisfies EnvField<string | undefined>,
};
