import { ConfigFieldError, type Env } from '@app/config';
import {
  type ChatCompletionsUpstream,
  type ChatCompletionsUpstreamModuleOptions,
  createChatCompletionsUpstream,
  HttpChatCompletionsUpstream,
} from '@app/llm';

/** One entry of GATEWAY_UPSTREAMS, checked, its API key read from the variable it names. */
export interface GatewayUpstreamConfig {
  readonly name: string;
  readonly baseUrl: string;
  /** The variable the key came from (named in messages; the key never is). */
  readonly apiKeyEnv: string;
  readonly apiKey: string;
  /** Model names, or prefixes ending in `*` (`*` alone: every model). */
  readonly models: readonly string[];
}

/** A metric label and a header value: short, plain. */
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_MODEL_LENGTH = 256;
const FIELDS = new Set(['name', 'base_url', 'api_key_env', 'models']);

/**
 * GATEWAY_UPSTREAMS: a JSON array, in fallback order, of
 * `{"name", "base_url", "api_key_env", "models"}`. Unset: undefined (the one
 * upstream of LLM_PROVIDER / OPENAI_*). Anything that does not parse, a
 * repeated name, an `api_key_env` that is unset: a start-up error naming the
 * entry by its position and the field, never a URL or a key (a base URL may
 * carry credentials).
 */
export function parseGatewayUpstreams(raw: string | undefined, all: Env): readonly GatewayUpstreamConfig[] | undefined {
  if (raw === undefined || raw.trim() === '') return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new ConfigFieldError('is not JSON: a JSON array of {"name", "base_url", "api_key_env", "models"}');
  }
  if (!Array.isArray(parsed) || parsed.length === 0)
    throw new ConfigFieldError('must be a non-empty JSON array of {"name", "base_url", "api_key_env", "models"}');
  const names = new Set<string>();
  return parsed.map((item: unknown, i): GatewayUpstreamConfig => {
    const entry = `entry ${i + 1}`;
    if (typeof item !== 'object' || item === null || Array.isArray(item))
      throw new ConfigFieldError(`${entry} is not an object`);
    const fields = item as Record<string, unknown>;
    const unknown = Object.keys(fields).find((f) => !FIELDS.has(f));
    if (unknown !== undefined)
      throw new ConfigFieldError(
        `${entry} has a field this version does not know: ${JSON.stringify(unknown.slice(0, 40))}`,
      );
    const { name, base_url: baseUrl, api_key_env: apiKeyEnv, models } = fields;
    if (typeof name !== 'string' || !NAME.test(name))
      throw new ConfigFieldError(
        `${entry}: name must be 1 to 32 letters, digits, '_', '.' or '-' (it is a metric label and a header value)`,
      );
    if (names.has(name)) throw new ConfigFieldError(`${entry}: the name ${name} is given to two upstreams`);
    names.add(name);
    if (typeof baseUrl !== 'string' || !isHttpUrl(baseUrl))
      throw new ConfigFieldError(`${entry} (${name}): base_url must be an http:// or https:// URL`);
    if (typeof apiKeyEnv !== 'string' || !ENV_NAME.test(apiKeyEnv))
      throw new ConfigFieldError(`${entry} (${name}): api_key_env must name an environment variable`);
    const apiKey = all[apiKeyEnv]?.trim();
    if (!apiKey) throw new ConfigFieldError(`${entry} (${name}): api_key_env names ${apiKeyEnv}, which is unset`);
    if (!Array.isArray(models) || models.length === 0)
      throw new ConfigFieldError(`${entry} (${name}): models must be a non-empty array of model names or prefixes`);
    models.forEach((model: unknown, m) => {
      if (
        typeof model !== 'string' ||
        model.length === 0 ||
        model.length > MAX_MODEL_LENGTH ||
        model.indexOf('*') !== (model.endsWith('*') ? model.length - 1 : -1)
      )
        throw new ConfigFieldError(
          `${entry} (${name}): models[${m}] must be a model name, or a prefix ending in * (one *, at the end)`,
        );
    });
    return { name, baseUrl, apiKeyEnv, apiKey, models: models as string[] };
  });
}

function isHttpUrl(value: string): boolean {
  try {
    const url = new URL(value);
    return url.protocol === 'http:' || url.protocol === 'https:';
  } catch {
    return false;
  }
}

/** One upstream the gateway may call: its name, the models it serves, and the client. */
export interface GatewayUpstream {
  readonly name: string;
  readonly models: readonly string[];
  readonly client: ChatCompletionsUpstream;
}

/** Whether an upstream's model list names the model (a name, or a prefix ending in `*`). */
export function servesModel(models: readonly string[], model: string): boolean {
  return models.some((m) => (m.endsWith('*') ? model.startsWith(m.slice(0, -1)) : m === model));
}

/**
 * The gateway's upstreams in fallback order: GATEWAY_UPSTREAMS, or the one
 * of LLM_PROVIDER / OPENAI_* (named after its provider, serving every model).
 */
export class GatewayUpstreams {
  readonly all: readonly GatewayUpstream[];
  private readonly byName: ReadonlyMap<string, GatewayUpstream>;

  constructor(all: readonly GatewayUpstream[]) {
    this.all = all;
    this.byName = new Map(all.map((u) => [u.name, u]));
  }

  static create(
    configured: readonly GatewayUpstreamConfig[] | undefined,
    provider: ChatCompletionsUpstreamModuleOptions,
  ): GatewayUpstreams {
    if (configured === undefined)
      return new GatewayUpstreams([
        { name: provider.provider, models: ['*'], client: createChatCompletionsUpstream(provider) },
      ]);
    return new GatewayUpstreams(
      configured.map((c) => ({
        name: c.name,
        models: c.models,
        client: createChatCompletionsUpstream({ provider: 'openai', apiKey: c.apiKey, baseUrl: c.baseUrl }),
      })),
    );
  }

  /** The upstreams that list the model, in fallback order (none: the model is no upstream's). */
  route(model: string): readonly GatewayUpstream[] {
    return this.all.filter((u) => servesModel(u.models, model));
  }

  named(name: string): GatewayUpstream | undefined {
    return this.byName.get(name);
  }

  /** Ends every kept-alive connection: for shutdown, once no call is running. */
  close(): void {
    for (const u of this.all) if (u.client instanceof HttpChatCompletionsUpstream) u.client.close();
  }
}
