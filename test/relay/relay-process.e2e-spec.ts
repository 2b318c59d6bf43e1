import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { eventually, freePort, testDatabaseUrl, testRedisUrl } from '../support/infra';
import { compileRelay, insertOutboxRows, relayFixture, rowByKey } from './relay-harness';

const ROOT = resolve(__dirname, '../..');

interface RelayProcess {
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
}

/**
 * `apps/relay/src/main.ts` as its own process (through ts-node, so no build is needed), ready when /health/ready
 * answers 200.
 */
async function spawnRelay(env: Record<string, string>): Promise<RelayProcess> {
  const healthPort = freePort(71);
  const { NODE_OPTIONS: _ignored, ...inherited } = process.env;
  const child = spawn(
    process.execPath,
    ['-r', 'ts-node/register', '-r', 'tsconfig-paths/register', 'apps/relay/src/main.ts'],
    {
      cwd: ROOT,
      env: {
        ...inherited,
        TS_NODE_TRANSPILE_ONLY: 'true',
        DATABASE_URL: testDatabaseUrl(),
        REDIS_URL: testRedisUrl(),
        HEALTH_PORT: String(healthPort),
        LOG_LEVEL: 'warn',
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  const exited = once(child, 'exit').then(([code, signal]) => ({
    code: code as number | null,
    signal: signal as NodeJS.Signals | null,
  }));
  let gone = false;
  void exited.then(() => (gone = true));
  try {
    await eventually(
      async () => {
        if (gone) throw new Error(`relay exited during start-up:\n${output}`);
        const res = await fetch(`http://127.0.0.1:${healthPort}/health/ready`).catch(() => undefined);
        return res?.status === 200 ? true : undefined;
      },
      20_000,
      'the relay process to be ready',
    );
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return { child, exited, output: () => output };
}

describe('relay: the process (main.ts)', () => {
  let running: RelayProcess | undefined;
  const { ds, provider } = relayFixture(70, {
    tearDown: async () => {
      running?.child.kill('SIGKILL');
    },
  });

  it('SIGTERM with a send in flight: the send finishes, is recorded as sent, and the process exits 0', async () => {
    running = await spawnRelay({ NOTIFY_WEBHOOK_URL: provider.url, NOTIFY_TIMEOUT_S: '5' });
    provider.answer = () => ({ status: 200, delayMs: 1000 });
    const [key] = await insertOutboxRows(ds, 1, 'sigterm');
    await eventually(() => (provider.deliveriesFor(key).length === 1 ? true : undefined), 3000, 'the send to start');

    running.child.kill('SIGTERM');
    const exit = await running.exited;
    expect({ ...exit, output: exit.code === 0 ? '' : running.output() }).toEqual({ code: 0, signal: null, output: '' });
    expect(provider.deliveriesFor(key)[0].answeredAt).toBeDefined();
    expect((await rowByKey(ds, key)).sent_at).toBeInstanceOf(Date);
    expect(provider.deliveriesFor(key)).toHaveLength(1);
  });

  it('killed (SIGKILL) after the provider received the send: another relay sends it again with the same key once the lease expires', async () => {
    // NOTIFY_TIMEOUT_S 0.5 → a lease of 2 s.
    const env = { NOTIFY_WEBHOOK_URL: provider.url, NOTIFY_TIMEOUT_S: '0.5' };
    running = await spawnRelay(env);
    const child = running.child;
    // The provider has the request; the relay dies before it hears back, so it records nothing.
    provider.answer = (_, n) => (n === 0 ? 'hang' : { status: 200 });
    const stopListening = provider.onRequest(() => child.kill('SIGKILL'));
    const [key] = await insertOutboxRows(ds, 1, 'sigkill');
    const exit = await running.exited;
    stopListening();
    expect(exit.signal).toBe('SIGKILL');
    expect(provider.deliveriesFor(key)).toHaveLength(1);
    const orphan = await rowByKey(ds, key);
    expect(orphan).toMatchObject({ sent_at: null, attempts: 0 });
    expect(orphan.lease_until).toBeInstanceOf(Date);

    // Its own sends may take as long as a loaded machine makes them; the dead relay's lease is what the test waits out.
    const other = await compileRelay({ env: { ...env, NOTIFY_TIMEOUT_S: '10' } });
    try {
      await eventually(
        async () => ((await other.relay.runOnce()).sent === 1 ? true : undefined),
        5000,
        'the second relay to send it',
      );
    } finally {
      await other.close();
    }
    const deliveries = provider.deliveriesFor(key);
    expect(deliveries).toHaveLength(2);
    expect(deliveries[1].idempotencyKey).toBe(key);
    expect(deliveries[1].rawBody).toBe(deliveries[0].rawBody);
    expect((await rowByKey(ds, key)).sent_at).toBeInstanceOf(Date);
  });
});
