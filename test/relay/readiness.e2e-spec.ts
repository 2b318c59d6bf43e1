import { REDIS_CLIENT } from '@app/redis';
import type { Server } from 'node:http';
import { Redis } from 'ioredis';
import request from 'supertest';
import { eventually, freePort, type RedisServer, startRedisServer } from '../support/infra';
import { startRelay, type RelayHarness } from './relay-harness';

/**
 * The relay lists its own readiness (PostgreSQL, its LISTEN connection) and
 * has no use for Redis: REDIS_URL points at a private redis-server, so any
 * connection the relay opened would show in its CLIENT LIST, and stopping it
 * must not make the relay unready.
 */
describe('relay readiness: PostgreSQL and the LISTEN connection, never Redis', () => {
  let redis: RedisServer;
  let relay: RelayHarness & { app: NonNullable<RelayHarness['app']> };
  let server: Server;

  beforeAll(async () => {
    redis = await startRedisServer(freePort(85));
    relay = await startRelay({ env: { REDIS_URL: redis.url } });
    server = relay.app.getHttpServer() as Server;
    await eventually(() => (relay.listener.listening ? true : undefined), 5000, 'the LISTEN connection');
  });
  afterAll(async () => {
    await relay?.close();
    await redis?.stop();
  });

  it('checks exactly PostgreSQL and the LISTEN connection, and opens no Redis connection', async () => {
    const ready = await request(server).get('/health/ready').expect(200);
    expect(Object.keys(ready.body.details).sort()).toEqual(['outbox_listen', 'postgres']);
    expect(() => relay.app.get(REDIS_CLIENT, { strict: false })).toThrow();

    const probe = new Redis(redis.url);
    try {
      const clients = (await probe.client('LIST')) as string;
      // Only this probe's own connection.
      expect(clients.trim().split('\n')).toHaveLength(1);
    } finally {
      probe.disconnect();
    }
  });

  it('stays ready with Redis down', async () => {
    await redis.stop();
    const ready = await request(server).get('/health/ready').expect(200);
    expect(Object.keys(ready.body.details).sort()).toEqual(['outbox_listen', 'postgres']);
    await request(server).get('/health/live').expect(200);
  });
});
