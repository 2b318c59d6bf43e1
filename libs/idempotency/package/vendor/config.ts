/* What the package takes from libs/config (see problem.ts): the backoff and a type, not the environment's schemas. */
export { backoffDelay, type Backoff, type Jitter } from '../../../config/src/backoff';
export type { RedisClusterConfig } from '../../../config/src/env-schema';
