import { Injectable } from '@nestjs/common';
import { HealthIndicatorService } from '@nestjs/terminus';
import { InjectRedis } from '@app/redis';
import type { Redis } from 'ioredis';

@Injectable()
export class RedisHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @InjectRedis() private readonly redis: Redis,
  ) {}

  check(timeoutMs = 1000) {
    return this.health
      .check('redis')
      .attempt(async () => {
        await this.redis.ping();
      })
      .withTimeout(timeoutMs);
  }
}
