import { Injectable } from '@nestjs/common';
import { ADMIN_ACTIONS_KEY } from '@app/summary-queue';
import { InjectRedis, type RedisClient } from '@app/redis';

export type AdminAction = 'redrive' | 'requeue';
export const ADMIN_ACTIONS: readonly AdminAction[] = ['redrive', 'requeue'];

/**
 * Operators' changes counted for the whole system, in Redis, so a change made
 * by the short-lived CLI counts as much as one made through the admin API.
 * Re-drives are counted by the re-drive script itself (atomically with the
 * re-drive); re-queues of parked outbox rows here, after their UPDATE commits.
 */
@Injectable()
export class AdminActionCounts {
  constructor(@InjectRedis() private readonly redis: RedisClient) {}

  async add(action: AdminAction, n: number): Promise<void> {
    if (n > 0) await this.redis.hincrby(ADMIN_ACTIONS_KEY, action, n);
  }

  async read(): Promise<Record<AdminAction, number>> {
    const h = await this.redis.hgetall(ADMIN_ACTIONS_KEY);
    return { redrive: Number(h.redrive ?? 0), requeue: Number(h.requeue ?? 0) };
  }
}
