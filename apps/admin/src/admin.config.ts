import { commonEnv, ConfigOf, type Env, parseConfig, processEnv } from '@app/config';
import { jobStreamPartitionsEnv } from '@app/summary-queue';

/** Every variable the admin CLI reads; JOB_STREAM_PARTITIONS so its dead letters and figures cover every partition. */
export const adminEnvSchema = { ...commonEnv, ...jobStreamPartitionsEnv };

export type AdminConfig = ConfigOf<typeof adminEnvSchema>;

export function loadAdminConfig(source: Env = processEnv()): AdminConfig {
  return parseConfig(adminEnvSchema, source);
}
