import type { RedisClient } from '@app/redis';
import { eventually } from './infra';

/** Each entry pending in `group` on `stream`, with its idle ms by XPENDING's own clock, by id. */
export async function pendingIdle(redis: RedisClient, stream: string, group: string): Promise<Map<string, number>> {
  const entries = (await redis.xpending(stream, group, '-', '+', 100)) as [string, string, number, number][];
  return new Map(entries.map(([id, , idle]) => [id, Number(idle)]));
}

/**
 * Waits until every entry pending in `group` on `stream` has been idle at least `ms` (XPENDING's idle times, the
 * ones a claim with that minimum idle time reads): claimable by a consumer whose CLAIM_IDLE_MS is `ms`. With nothing
 * pending, at once. Their idle times then.
 */
export function idlePast(redis: RedisClient, stream: string, group: string, ms: number): Promise<Map<string, number>> {
  return eventually(
    async () => {
      const idle = await pendingIdle(redis, stream, group);
      return [...idle.values()].every((n) => n >= ms) ? idle : undefined;
    },
    5000,
    `the entries pending on ${stream} idle ${ms} ms`,
  );
}
