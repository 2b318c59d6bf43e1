import { Injectable } from '@nestjs/common';
import { HealthIndicatorService } from '@nestjs/terminus';
import { Test } from '@nestjs/testing';
import { ProblemException } from '@app/problem';
import { HealthChecksRegistry } from './health-checks.registry';
import { HealthController } from './health.controller';
import { HealthModule } from './health.module';
import type { ReadinessIndicator, ReadinessIndicatorClass } from './readiness-indicator';

@Injectable()
class QueueUp implements ReadinessIndicator {
  constructor(private readonly health: HealthIndicatorService) {}
  check() {
    return this.health
      .check('queue')
      .attempt(() => Promise.resolve())
      .withTimeout(100);
  }
}

@Injectable()
class StoreDown implements ReadinessIndicator {
  constructor(private readonly health: HealthIndicatorService) {}
  check() {
    return this.health
      .check('store')
      .attempt(() => Promise.reject(new Error('connection refused')))
      .withTimeout(100);
  }
}

/*
 * No RedisModule and no DataSource in these graphs: the module asks for
 * nothing but what the app lists, so a graph without Redis compiles.
 */
async function controllerWith(readiness: ReadinessIndicatorClass[]) {
  const moduleRef = await Test.createTestingModule({ imports: [HealthModule.forRoot({ readiness })] }).compile();
  return { controller: moduleRef.get(HealthController), registry: moduleRef.get(HealthChecksRegistry), moduleRef };
}

const notReady = async (ready: Promise<unknown>) => {
  const err: unknown = await ready.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProblemException);
  const problem: Record<string, unknown> = { ...(err as ProblemException).problem };
  return problem;
};

describe('HealthModule.forRoot({ readiness })', () => {
  it('checks exactly the indicators the app lists', async () => {
    const { controller, moduleRef } = await controllerWith([QueueUp]);
    try {
      const ready = (await controller.ready()) as { status: string; details: Record<string, unknown> };
      expect(ready.status).toBe('ok');
      expect(Object.keys(ready.details)).toEqual(['queue']);
    } finally {
      await moduleRef.close();
    }
  });

  it('adds the checks the app registers at run time, and names what fails in a 503', async () => {
    const { controller, registry, moduleRef } = await controllerWith([QueueUp, StoreDown]);
    try {
      registry.registerReadiness('listen', () => Promise.resolve());
      const problem = await notReady(controller.ready());
      expect(problem.status).toBe(503);
      expect(problem.failing).toEqual(['store']);
      // Keyed by check, in the order they settled.
      expect(Object.keys(problem.checks as object).sort()).toEqual(['listen', 'queue', 'store']);
    } finally {
      await moduleRef.close();
    }
  });

  it('keeps liveness inside the process: a failing dependency does not touch it', async () => {
    const { controller, moduleRef } = await controllerWith([StoreDown]);
    try {
      expect(controller.live()).toEqual({ status: 'ok' });
    } finally {
      await moduleRef.close();
    }
  });
});
