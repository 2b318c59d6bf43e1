import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { apiDrainMs, loadApiConfig } from '../../apps/api/src/api.config';
import { loadRelayConfig } from '../../apps/relay/src/relay.config';
import { loadWorkerConfig } from '../../apps/worker/src/worker.config';

/*
 * docker-compose.yml checked against the apps, as test/deploy/manifests.spec.ts
 * checks the Kubernetes manifests (no Docker engine here to run it): each app
 * runs by its command with a configuration its own loader accepts, is health
 * checked on the port it serves, waits for its dependencies and the migration,
 * and is given longer than its drain to stop.
 */

interface Service {
  image?: string;
  build?: unknown;
  command?: string[];
  environment?: Record<string, string>;
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test: string[] };
  stop_grace_period?: string;
  volumes?: string[];
}

const compose = parse(readFileSync(join(__dirname, '../../docker-compose.yml'), 'utf8'), { merge: true }) as {
  services: Record<string, Service>;
};
const services = compose.services;
const seconds = (d: string | undefined): number => {
  const m = /^(\d+)s$/.exec(d ?? '');
  return m ? Number(m[1]) : 10; // Docker's default
};

const APPS = {
  api: (env: Record<string, string>) => {
    const c = loadApiConfig(env);
    return { port: c.port, drain: apiDrainMs(c) / 1000 };
  },
  worker: (env: Record<string, string>) => {
    const c = loadWorkerConfig(env);
    return { port: c.healthPort, drain: c.jobBudgetMs / 1000 + 1 };
  },
  relay: (env: Record<string, string>) => {
    const c = loadRelayConfig(env);
    return { port: c.healthPort, drain: c.notifyTimeoutMs / 1000 + 5 };
  },
} as const;

describe('docker-compose.yml', () => {
  it('runs Redis 7 with AOF on (the stream is the queue) and PostgreSQL 16, both health checked, on volumes', () => {
    expect(services.redis.image).toMatch(/^redis:7(\.|$)/);
    expect(services.redis.command?.join(' ')).toMatch(/--appendonly yes/);
    expect(services.postgres.image).toMatch(/^postgres:16(\.|$)/);
    for (const name of ['redis', 'postgres']) {
      expect({ name, healthcheck: Boolean(services[name].healthcheck) }).toEqual({ name, healthcheck: true });
      expect({ name, volumes: services[name].volumes?.length ?? 0 }).toEqual({ name, volumes: 1 });
    }
  });

  it('migrates once, with the admin CLI of the same image, after PostgreSQL is healthy', () => {
    const m = services.migrate;
    expect(m.command).toEqual(['node', 'dist/apps/admin/main.js', 'migrate']);
    expect(m.depends_on).toEqual({ postgres: { condition: 'service_healthy' } });
    expect(m.image).toBe(services.api.image);
  });

  it.each(Object.keys(APPS) as (keyof typeof APPS)[])(
    '%s: its command, a configuration it accepts, health, order, and time to drain',
    (app) => {
      const s = services[app];
      expect(s.command).toEqual(['node', `dist/apps/${app}/main.js`]);
      expect(s.image).toBe(services.migrate.image);
      expect(s.environment?.NODE_ENV).toBe('production');
      const { port, drain } = APPS[app](s.environment ?? {});
      expect(s.healthcheck?.test.join(' ')).toContain(`http://127.0.0.1:${port}/health/ready`);
      expect(s.depends_on).toEqual({
        redis: { condition: 'service_healthy' },
        postgres: { condition: 'service_healthy' },
        migrate: { condition: 'service_completed_successfully' },
        // The worker's model calls go through the api's gateway.
        ...(app === 'worker' ? { api: { condition: 'service_healthy' } } : {}),
      });
      expect({ app, grace: seconds(s.stop_grace_period) > drain }).toEqual({ app, grace: true });
    },
  );

  it("sends the worker's model calls through the api's gateway, both apps with the same INTERNAL_API_KEY", () => {
    const api = services.api.environment ?? {};
    const worker = services.worker.environment ?? {};
    expect(worker.LLM_GATEWAY_URL).toBe(`http://api:${loadApiConfig(api).port}`);
    expect(worker.INTERNAL_API_KEY).toBeDefined();
    expect(api.INTERNAL_API_KEY).toBe(worker.INTERNAL_API_KEY);
    // Both loaders take it (in production 24+ characters, none of the tenant or admin keys), and the worker is in
    // gateway mode, reading no provider settings.
    expect(loadApiConfig(api).internalApiKey).toBe(api.INTERNAL_API_KEY);
    expect(api.NODE_ENV).toBe('production');
    expect(loadWorkerConfig(worker)).toMatchObject({
      internalApiKey: worker.INTERNAL_API_KEY,
      llmGatewayUrl: worker.LLM_GATEWAY_URL,
      openaiApiKey: undefined,
    });
    expect(services.relay.environment?.INTERNAL_API_KEY).toBeUndefined();
  });
});
