import { commonEnv, ConfigOf, env, parseConfig, type Env } from '@app/config';

const relaySchema = {
  ...commonEnv,
  healthPort: env.int('HEALTH_PORT', 3002, { min: 0, max: 65535 }),
};

export type RelayConfig = ConfigOf<typeof relaySchema>;

export function loadRelayConfig(source: Env): RelayConfig {
  return parseConfig(relaySchema, source);
}
