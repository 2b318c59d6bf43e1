import { commonEnv, ConfigOf, type Env, parseConfig, processEnv } from '@app/config';

/** Every variable the admin CLI reads. */
export const adminEnvSchema = { ...commonEnv };

export type AdminConfig = ConfigOf<typeof adminEnvSchema>;

export function loadAdminConfig(source: Env = processEnv()): AdminConfig {
  return parseConfig(adminEnvSchema, source);
}
