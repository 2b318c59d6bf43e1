import request from 'supertest';
import { HealthChecksRegistry } from '@app/health';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually, freePort, startRedisServer } from '../support/infra';
import { startWorker } from '../support/worker-harness';

/** Liveness is about the process's own loop; readiness about its dependencies. */
describe('worker health', () => {
  let model: FakeOpenAiServer;
  beforeAll(async () => {
    model = await new FakeOpenAiServer().start();
  });
  afterAll(() => model.stop());

  it('stays live while Redis is down (only readiness fails), and turns its loop all the while', async () => {
    const redis = await startRedisServer(freePort(20));
    const w = await startWorker({ modelUrl: model.baseUrl, env: { REDIS_URL: redis.url }, consumer: { blockMs: 100 } });
    try {
      w.consumer.start();
      const server = w.app.getHttpServer();
      await request(server).get('/health/live').expect(200);
      const up = await request(server).get('/health/ready').expect(200);
      // The worker's own list: Redis (the stream) and PostgreSQL.
      expect(Object.keys(up.body.details).sort()).toEqual(['postgres', 'redis']);
      const beats = jest.spyOn(w.app.get(HealthChecksRegistry), 'beat');
      await redis.stop();
      const ready = await eventually(
        async () => {
          const res = await request(server).get('/health/ready');
          return res.status === 503 ? res : undefined;
        },
        5000,
        'readiness to see Redis gone',
      );
      expect(ready.body.failing).toEqual(['redis']);
      // The loop turns on with Redis down: it beats again after readiness has failed.
      const seen = beats.mock.calls.length;
      await eventually(() => (beats.mock.calls.length > seen ? true : undefined), 5000, 'a beat of the loop');
      await request(server).get('/health/live').expect(200);
    } finally {
      await w.close();
      await redis.stop();
    }
  });

  it('fails liveness, naming the loop, when a loop stops turning', async () => {
    const w = await startWorker({ modelUrl: model.baseUrl });
    try {
      // A loop that registered and then stuck: it never beats again.
      const registry = w.app.get(HealthChecksRegistry);
      registry.registerLoop('stuck-loop', 100);
      // Silent past its limit, on the registry's own clock.
      await eventually(
        () => (registry.staleLoops().some((l) => l.name === 'stuck-loop') ? true : undefined),
        5000,
        'the loop to be silent past its limit',
      );
      const res = await request(w.app.getHttpServer()).get('/health/live').expect(503);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body.stale).toEqual([{ name: 'stuck-loop', silentMs: expect.any(Number) }]);
    } finally {
      await w.close();
    }
  });
});
