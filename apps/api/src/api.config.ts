import { commonEnv, ConfigOf, env, parseConfig, type Env } from '@app/config';
import { parseApiKeys } from './auth/api-keys';

/** Every variable the api reads (INTERFACE.md); the manifests are checked against it. */
export const apiEnvSchema = {
  ...commonEnv,
  port: env.int('PORT', 3000, { min: 0, max: 65535 }),
  apiKeys: env.custom('API_KEYS', (raw, all) => parseApiKeys(raw, all.NODE_ENV === 'production')),
  idempotencyLockTtlMs: env.secondsAsMs('IDEMPOTENCY_LOCK_TTL_S', 30, { min: 1, max: 3600 }),
  idempotencyResultTtlMs: env.secondsAsMs('IDEMPOTENCY_RESULT_TTL_S', 86400, { min: 60, max: 30 * 86400 }),
};

export type ApiConfig = ConfigOf<typeof apiEnvSchema>;

/** The api's whole configuration, validated once at boot; throws naming every bad variable. */
export function loadApiConfig(source: Env): ApiConfig {
  return parseConfig(apiEnvSchema, source);
}
