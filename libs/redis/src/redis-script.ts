import { createHash } from 'node:crypto';
import type { RedisClient } from './create-redis-client';

/**
 * A Lua script run with EVALSHA, falling back to EVAL once when the server has
 * not seen it (after a restart or failover): one round trip in the common case.
 */
export class RedisScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly lua: string,
  ) {
    this.sha = createHash('sha1').update(lua).digest('hex');
  }

  async run<T = unknown>(client: RedisClient, keys: readonly string[], args: readonly (string | number)[]): Promise<T> {
    try {
      return (await client.evalsha(this.sha, keys.length, ...keys, ...args)) as T;
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err;
      return (await client.eval(this.lua, keys.length, ...keys, ...args)) as T;
    }
  }
}
