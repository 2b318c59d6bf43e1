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
 * be long enough to resist guessing. An entry that could be read two ways (a
 * second `:` makes `a:POST:k` tenant `a` or `a:POST`), an empty part, or a key
 * given to two tenants stops the start. Errors name the entry by its position
 * only: an entry written the wrong way round (`key:tenant`) would put the key
 * where the tenant should be.
 */
export function parseApiKeys(raw: string | undefined, production: boolean): readonly ApiKeyEntry[] {
  if (raw === undefined) {
    if (production) throw new ConfigFieldError('is required in production (tenant:key pairs, comma separated)');
    return DEMO_API_KEYS;
  }
  const entries: ApiKeyEntry[] = [];
  const owners = new Map<string, { tenant: string; entry: number }>();
  for (const [i, pair] of raw.split(',').entries()) {
    const entry = `entry ${i + 1}`;
    const parts = pair.trim().split(':');
    if (parts.length === 1)
      throw new ConfigFieldError(
        `${entry} is not tenant:key${parts[0] === '' ? ' (it is empty: a stray comma?)' : ''}`,
      );
    if (parts.length > 2)
      throw new ConfigFieldError(
        `${entry} has more than one ':', so its tenant and key could be read two ways; neither may contain ':'`,
      );
    const [tenant, key] = parts;
    if (tenant === '') throw new ConfigFieldError(`${entry} has an empty tenant`);
    if (!TENANT.test(tenant))
      throw new ConfigFieldError(
        `${entry} has an invalid tenant name (1 to 64 letters, digits, _ . -, starting with a letter or digit)`,
      );
    if (key === '') throw new ConfigFieldError(`${entry} has an empty key`);
    if (!KEY.test(key))
      throw new ConfigFieldError(`${entry} has a key with spaces or characters other than printable ASCII`);
    if (production && key.length < MIN_PRODUCTION_KEY_LENGTH) {
      throw new ConfigFieldError(
        `${entry}: keys must be at least ${MIN_PRODUCTION_KEY_LENGTH} characters in production`,
      );
    }
    const owner = owners.get(key);
    if (owner !== undefined && owner.tenant !== tenant) {
      throw new ConfigFieldError(
        `${entry} has the key of entry ${owner.entry}, another tenant's: a key names one tenant`,
      );
    }
    owners.set(key, { tenant, entry: i + 1 });
    entries.push({ tenant, key });
  }
  return entries;
}
