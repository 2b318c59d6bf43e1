import { Injectable } from '@nestjs/common';
import { HealthIndicatorService } from '@nestjs/terminus';
import { InjectRedis, type RedisClient } from '@app/redis';

@Injectable()
export class RedisHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @InjectRedis() private readonly redis: RedisClient,
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
