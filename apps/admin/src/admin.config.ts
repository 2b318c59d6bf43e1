import { commonEnv, ConfigOf, parseConfig, type Env } from '@app/config';

/** Every variable the admin CLI reads. */
export const adminEnvSchema = { ...commonEnv };

export type AdminConfig = ConfigOf<typeof adminEnvSchema>;

export function loadAdminConfig(source: Env): AdminConfig {
  return parseConfig(adminEnvSchema, source);
}
