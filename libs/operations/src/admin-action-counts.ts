import { Injectable } from '@nestjs/common';
import { ADMIN_ACTIONS_KEY } from '@app/summary-queue';
import { OperatedQueues } from '@app/workflows';
import { InjectRedis, type RedisClient } from '@app/redis';

export type AdminAction = 'redrive' | 'requeue';
export const ADMIN_ACTIONS: readonly AdminAction[] = ['redrive', 'requeue'];

/**
 * Operators' changes counted for the whole system, in Redis, so a change made
 * by the short-lived CLI counts as much as one made through the admin API.
 * Re-drives are counted by the re-drive script itself (atomically with the
 * re-drive, in the dead letter's queue's partition); re-queues of parked outbox rows
 * here, after their UPDATE commits, in ADMIN_ACTIONS_KEY. The figures are the
 * sums over those keys (one key with one partition).
 */
@Injectable()
export class AdminActionCounts {
  private readonly keys: readonly string[];

  constructor(
    @InjectRedis() private readonly redis: RedisClient,
    queues: OperatedQueues,
  ) {
    const perPartition = queues.all.flatMap((q) => q.layout.partitions.map((p) => p.adminActions));
    this.keys = [...new Set([ADMIN_ACTIONS_KEY, ...perPartition])];
  }

  async add(action: AdminAction, n: number): Promise<void> {
    if (n > 0) await this.redis.hincrby(ADMIN_ACTIONS_KEY, action, n);
  }

  async read(): Promise<Record<AdminAction, number>> {
    // One command a key: on a cluster they live in different slots.
    const hashes = await Promise.all(this.keys.map((key) => this.redis.hgetall(key)));
    const sum = (action: AdminAction) => hashes.reduce((n, h) => n + Number(h[action] ?? 0), 0);
    return { redrive: sum('redrive'), requeue: sum('requeue') };
  }
}
