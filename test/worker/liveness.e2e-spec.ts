import request from 'supertest';
import { HealthChecksRegistry } from '@app/health';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { freePort, sleep, startRedisServer } from '../support/infra';
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
      await redis.stop();
      await sleep(500);
      const ready = await request(server).get('/health/ready').expect(503);
      expect(ready.body.failing).toEqual(['redis']);
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
      w.app.get(HealthChecksRegistry).registerLoop('stuck-loop', 100);
      await sleep(200);
      const res = await request(w.app.getHttpServer()).get('/health/live').expect(503);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body.stale).toEqual([{ name: 'stuck-loop', silentMs: expect.any(Number) }]);
    } finally {
      await w.close();
    }
  });
});
