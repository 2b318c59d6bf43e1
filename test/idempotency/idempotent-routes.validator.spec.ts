import { Controller, Next, Post, Res, Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { IdempotencyModule, IdempotentMetadata, Idempotent, RedisIdempotencyStore } from '@app/idempotency';
import type { NextFunction, Response } from 'express';
import type { Redis } from 'ioredis';
import { freshRedis } from '../support/infra';

/*
 * What IdempotencyModule refuses when the application starts, so that a
 * route it cannot protect never serves a request.
 */

@Controller('raw')
class RawResponseController {
  @Post()
  @Idempotent()
  create(@Res() res: Response): void {
    res.status(201).json({ ok: true });
  }
}

@Controller('next')
class NextController {
  @Post()
  @Idempotent()
  create(@Next() next: NextFunction): void {
    next();
  }
}

@Controller('class-level')
@Idempotent()
class ClassLevelController {
  @Post()
  create(@Res() res: Response): void {
    res.json({});
  }
}

@Controller('passthrough')
@Idempotent()
class PassthroughController {
  @Post()
  create(@Res({ passthrough: true }) res: Response): { ok: true } {
    res.status(201);
    return { ok: true };
  }
}

@Controller('not-idempotent')
class PlainRawController {
  @Post()
  create(@Res() res: Response): void {
    res.json({});
  }
}

@Controller('bad-options')
class BadOptionsController {
  @Post()
  // Set without the decorator, which would have refused it
  @IdempotentMetadata({ lockTtlMs: 1.5 })
  create(): { ok: true } {
    return { ok: true };
  }
}

describe('IdempotencyModule at start-up', () => {
  let redis: Redis;
  beforeAll(async () => {
    redis = await freshRedis();
  });
  afterAll(() => redis.disconnect());

  const start = async (
    controllers: Type[],
    options: { lockTtlMs?: number; resultTtlMs?: number; maxStoredBodyBytes?: number } = {},
  ) => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        IdempotencyModule.forRoot({ store: new RedisIdempotencyStore(redis), scope: () => 'tenant', ...options }),
      ],
      controllers,
    }).compile();
    try {
      await moduleRef.init();
    } finally {
      await moduleRef.close();
    }
  };

  it('refuses @Idempotent() routes that take @Res() without passthrough or @Next(), naming each, and only those', async () => {
    const message = await start([
      RawResponseController,
      NextController,
      ClassLevelController,
      PassthroughController,
      PlainRawController,
    ]).then(
      () => 'it started',
      (err: Error) => err.message,
    );
    expect(message).toMatch(/@Idempotent\(\) on RawResponseController\.create: .*passthrough/);
    expect(message).toContain('@Idempotent() on NextController.create:');
    expect(message).toContain('@Idempotent() on ClassLevelController.create:');
    // @Res({ passthrough: true }) is fine, and so is @Res() on a route without @Idempotent().
    expect(message).not.toContain('PassthroughController');
    expect(message).not.toContain('PlainRawController');
    await expect(start([PassthroughController, PlainRawController])).resolves.toBeUndefined();
  });

  it('refuses route options that are not positive whole numbers, however they were set', async () => {
    await expect(start([BadOptionsController])).rejects.toThrow(
      /BadOptionsController\.create: lockTtlMs must be a positive whole number/,
    );
  });

  it.each([
    ['lockTtlMs', 2.5],
    ['resultTtlMs', 0],
    ['maxStoredBodyBytes', -1],
  ])('refuses module options with %s %p', async (name, value) => {
    await expect(start([PassthroughController], { [name]: value })).rejects.toThrow(
      new RegExp(`IdempotencyModule options: ${name} must be a positive whole number`),
    );
  });
});
