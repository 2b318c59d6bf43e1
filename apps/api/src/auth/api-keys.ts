import { ConfigFieldError } from '@app/config';

export interface ApiKeyEntry {
  readonly tenant: string;
  readonly key: string;
}

const TENANT = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const KEY = /^[\x21-\x7e]+$/;
const MIN_PRODUCTION_KEY_LENGTH = 16;
export const DEMO_API_KEYS: readonly ApiKeyEntry[] = [{ tenant: 'demo', key: 'demo-key' }];

/**
 * API_KEYS: `tenant:key` pairs, comma separated. A tenant may have several
 * keys (rotation); a key names exactly one tenant. Outside production an unset
 * variable means the demo pair; in production it is an error, and keys must
 * be long enough to resist guessing.
 */
export function parseApiKeys(raw: string | undefined, production: boolean): readonly ApiKeyEntry[] {
  if (raw === undefined) {
    if (production) throw new ConfigFieldError('is required in production (tenant:key pairs, comma separated)');
    return DEMO_API_KEYS;
  }
  const entries: ApiKeyEntry[] = [];
  const seen = new Map<string, string>();
  for (const [i, pair] of raw.split(',').entries()) {
    const item = pair.trim();
    const colon = item.indexOf(':');
    if (colon < 0) throw new ConfigFieldError(`entry ${i + 1} is not tenant:key`);
    const tenant = item.slice(0, colon);
    const key = item.slice(colon + 1);
    if (!TENANT.test(tenant)) throw new ConfigFieldError(`entry ${i + 1} has an invalid tenant name (letters, digits, _ . -)`);
    if (!KEY.test(key)) throw new ConfigFieldError(`entry ${i + 1} has an empty key or one with spaces`);
    if (production && key.length < MIN_PRODUCTION_KEY_LENGTH) {
      throw new ConfigFieldError(`entry ${i + 1}: keys must be at least ${MIN_PRODUCTION_KEY_LENGTH} characters in production`);
    }
    const owner = seen.get(key);
    if (owner !== undefined && owner !== tenant) throw new ConfigFieldError(`entry ${i + 1} reuses another tenant's key`);
    seen.set(key, tenant);
    entries.push({ tenant, key });
  }
  return entries;
}
