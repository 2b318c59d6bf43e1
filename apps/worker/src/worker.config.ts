import { commonEnv, ConfigOf, env, parseConfig, type Env } from '@app/config';

const workerSchema = {
  ...commonEnv,
  healthPort: env.int('HEALTH_PORT', 3001, { min: 0, max: 65535 }),
};

export type WorkerConfig = ConfigOf<typeof workerSchema>;

export function loadWorkerConfig(source: Env): WorkerConfig {
  return parseConfig(workerSchema, source);
}
