import { Injectable } from '@nestjs/common';
import { HealthIndicatorService } from '@nestjs/terminus';
import { DataSource } from 'typeorm';

@Injectable()
export class PostgresHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    private readonly dataSource: DataSource,
  ) {}

  check(timeoutMs = 1000) {
    return this.health
      .check('postgres')
      .attempt(async () => {
        await this.dataSource.query('SELECT 1');
      })
      .withTimeout(timeoutMs);
  }
}
