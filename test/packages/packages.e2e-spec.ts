import { createSummary, idempotencyKey } from '@app/client';
import { JOBS_STREAM } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Client } from 'pg';
import { type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { BASE_DATABASE_URL, freePort, freshRedis, testDatabaseName, testRedisUrl } from '../support/infra';

/*
 * `npm run pack`'s tarballs as someone else's app gets them: a folder in the
 * temp directory with no path aliases and no monorepo, the tarballs and
 * their peers installed by npm (our lockfile's versions, so the npm cache
 * serves them; in a second folder, Nest 11), the app of
 * test/packages/scratch-app compiled by tsc against the packages'
 * declarations, then run. Effects asserted: the handler's runs, the
 * answers, the api's jobs.
 */

const ROOT = join(__dirname, '..', '..');
const execFileAsync = promisify(execFile);

/** Runs a command; when it fails, the error says what it printed (tsc's errors are on stdout). */
async function run(
  command: string,
  args: string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<{ stdout: string }> {
  try {
    return await execFileAsync(command, args, { cwd: ROOT, ...options });
  } catch (error) {
    const { stdout, stderr } = error as { stdout?: string; stderr?: string };
    throw new Error(`${command} ${args.join(' ')} failed:\n${stdout ?? ''}${stderr ?? ''}`, { cause: error });
  }
}

/** What the scratch app installs beside the tarballs, at the versions this repository has installed. */
const PEERS = [
  '@nestjs/common',
  '@nestjs/core',
  '@nestjs/platform-express',
  'ioredis',
  'pg',
  'reflect-metadata',
  'rxjs',
  '@types/node',
  '@types/express',
  '@types/pg',
];

/** Where this run packs the tarballs: a folder of its own, so that two slots' runs never share one. */
const PACKED = mkdtempSync(join(tmpdir(), 'llmwf-packed-'));

/** The tarball `npm pack` made of the package whose manifest is in libs/<lib>/package. */
function tarball(lib: string): string {
  const { name, version } = JSON.parse(
    readFileSync(join(ROOT, 'libs', lib, 'package', 'package.manifest.json'), 'utf8'),
  ) as { name: string; version: string };
  return `file:${join(PACKED, `${name.slice(1).replace('/', '-')}-${version}.tgz`)}`;
}

/** The Nest apps the packages are installed into: this repository's Nest (12), and the last Nest 11. */
/*
 * Nest 12: an ES module app (its package.json's "type"), on Nest's default Express adapter. Nest 11: a
 * CommonJS app (node10 resolution), on DirectAnswerExpressAdapter, which its README requires there.
 */
const APPS = [
  { nest: '12', tsconfig: 'tsconfig.json', versions: {}, esm: true, env: { NEST_DEFAULT_ADAPTER: '1' } },
  {
    nest: '11',
    tsconfig: 'tsconfig.node10.json',
    versions: { '@nestjs/common': '11.2.10', '@nestjs/core': '11.2.10', '@nestjs/platform-express': '11.2.10' },
    esm: false,
    env: {},
  },
] as const;

interface ScratchApp {
  readonly dir: string;
  readonly child: ChildProcess;
  readonly base: string;
  readonly database: string;
}

function installedVersion(name: string): string {
  return (JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string })
    .version;
}

interface Answer {
  readonly status: number;
  readonly headers: Headers;
  readonly body: Record<string, unknown>;
}

describe('npm run pack: the packages in an app outside the repository', () => {
  const apps = new Map<string, ScratchApp>();
  /** What each app's start made so far (its folder, its database, its process): removed after, however far it got. */
  const made: { dir?: string; database?: string; child?: ChildProcess }[] = [];
  let redis: Redis;
  let api: ApiHarness;

  /** Runs `statements` on the server, from its maintenance database. */
  async function onServer(...statements: string[]): Promise<void> {
    const admin = new Client({ connectionString: BASE_DATABASE_URL });
    await admin.connect();
    try {
      for (const statement of statements) await admin.query(statement);
    } finally {
      await admin.end();
    }
  }

  /** A folder with the tarballs and Nest `nest` installed, the app compiled and started on its own database. */
  async function startScratchApp(
    { nest, tsconfig, versions, esm, env }: (typeof APPS)[number],
    port: number,
  ): Promise<ScratchApp> {
    const left: (typeof made)[number] = {};
    made.push(left);
    const database = (left.database = `${testDatabaseName()}_packages${nest}`);
    await onServer(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`, `CREATE DATABASE ${database}`);
    const dir = (left.dir = mkdtempSync(join(tmpdir(), `llmwf-packages-nest${nest}-`)));
    cpSync(join(__dirname, 'scratch-app'), dir, { recursive: true });
    writeFileSync(
      join(dir, 'package.json'),
      JSON.stringify({
        name: `scratch-app-nest${nest}`,
        private: true,
        ...(esm ? { type: 'module' } : {}),
        dependencies: {
          '@llm-workflows/nestjs-idempotency': tarball('idempotency'),
          '@llm-workflows/client': tarball('client'),
          ...Object.fromEntries(PEERS.map((name) => [name, installedVersion(name)])),
          ...versions,
        },
      }),
    );
    await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: dir });
    // The repository's TypeScript, on the app and the packages' .d.ts as installed (skipLibCheck off).
    await run(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(dir, tsconfig)]);

    const url = new URL(BASE_DATABASE_URL);
    url.pathname = `/${database}`;
    const child = spawn(process.execPath, [join(dir, 'dist', 'main.js')], {
      cwd: dir,
      env: {
        PATH: process.env.PATH,
        PORT: String(port),
        REDIS_URL: testRedisUrl(),
        KEY_PREFIX: `packages:nest${nest}:`,
        ...env,
        DATABASE_URL: url.toString(),
      },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    left.child = child;
    await new Promise<void>((resolve, reject) => {
      // The test's own bound on a start that hangs (a store it cannot reach): far past a start's time.
      const timer = setTimeout(() => reject(new Error(`the Nest ${nest} scratch app did not listen`)), 60_000);
      child.stdout.on('data', (d: Buffer) => {
        if (!d.toString().includes('"listening"')) return;
        clearTimeout(timer);
        resolve();
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`the Nest ${nest} scratch app exited (${code}) before listening`));
      });
    });
    return { dir, child, base: `http://127.0.0.1:${port}`, database };
  }

  beforeAll(async () => {
    redis = await freshRedis();
    await run(process.execPath, [join(ROOT, 'scripts', 'pack.mjs')], { env: { ...process.env, PACK_OUT: PACKED } });
    const started = await Promise.allSettled(APPS.map((app, i) => startScratchApp(app, freePort(90 + i))));
    started.forEach((s, i) => s.status === 'fulfilled' && apps.set(APPS[i].nest, s.value));
    for (const s of started) if (s.status === 'rejected') throw s.reason;
    api = await startApi();
    await api.app.listen(0, '127.0.0.1');
  }, 120_000);

  afterAll(async () => {
    for (const { child, dir, database } of made) {
      if (child && child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await once(child, 'exit');
      }
      if (database) await onServer(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
      if (dir) rmSync(dir, { recursive: true, force: true });
    }
    rmSync(PACKED, { recursive: true, force: true });
    await api?.close();
    for (const key of await redis.keys('packages:nest*')) await redis.del(key);
    redis?.disconnect();
  });

  describe.each(APPS)('in a Nest $nest app', ({ nest }) => {
    const send = async (path: string, body?: unknown, key?: string): Promise<Answer> => {
      const res = await fetch(`${apps.get(nest)!.base}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      const parsed = text ? (JSON.parse(text) as Record<string, unknown>) : {};
      return { status: res.status, headers: res.headers, body: parsed };
    };
    const runs = async (): Promise<number> =>
      ((await (await fetch(`${apps.get(nest)!.base}/runs`)).json()) as { runs: number }).runs;

    it('each package as installed has its README, its declarations and a licence', () => {
      for (const name of ['@llm-workflows/nestjs-idempotency', '@llm-workflows/client']) {
        const installed = join(apps.get(nest)!.dir, 'node_modules', name);
        const manifest = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')) as Record<string, string>;
        expect(manifest.license).toEqual(expect.any(String));
        expect(existsSync(join(installed, manifest.types))).toBe(true);
        expect(readFileSync(join(installed, 'README.md'), 'utf8')).toContain(`# ${name}`);
      }
      const core = join(apps.get(nest)!.dir, 'node_modules', '@nestjs', 'core', 'package.json');
      expect((JSON.parse(readFileSync(core, 'utf8')) as { version: string }).version).toMatch(
        new RegExp(`^${nest}\\.`),
      );
    });

    it('@Idempotent(): a new key runs the handler, the same key and body replay its answer', async () => {
      const key = idempotencyKey('order', 'replay');
      const first = await send('/orders', { sku: 'tea', quantity: 2 }, key);
      expect(first.status).toBe(201);
      expect(first.headers.get('idempotent-replayed')).toBeNull();
      const order = first.body.order;
      expect(first.body).toEqual({ order, sku: 'tea', quantity: 2 });

      const again = await send('/orders', { sku: 'tea', quantity: 2 }, key);
      expect(again.status).toBe(201);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.body).toEqual(first.body);
      expect(await runs()).toBe(order);
    });

    it('@Idempotent(): the same key with another body is a 422 problem, and nothing runs', async () => {
      const key = idempotencyKey('order', 'mismatch');
      expect((await send('/orders', { sku: 'tea', quantity: 1 }, key)).status).toBe(201);
      const before = await runs();

      const other = await send('/orders', { sku: 'tea', quantity: 9 }, key);
      expect(other.status).toBe(422);
      expect(other.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(other.body.type).toBe('urn:llm-workflows:problem:idempotency-key-reused');
      expect(await runs()).toBe(before);
    });

    it('@Idempotent(): a storm of 20 identical requests runs the handler once; the others get 409, then the replay', async () => {
      const key = idempotencyKey('order', 'storm');
      const before = await runs();
      await send('/hold');
      const storm = Array.from({ length: 20 }, () => send('/orders', { sku: 'jam', quantity: 1 }, key));
      // Every request but the one that holds the key is refused while it runs, so 19 answers come while it waits.
      const answered: Answer[] = [];
      await new Promise<void>((resolve) => {
        for (const p of storm) {
          void p.then((a) => {
            answered.push(a);
            if (answered.length === 19) resolve();
          });
        }
      });
      let all: Answer[];
      try {
        expect(answered.map((a) => a.status)).toEqual(Array(19).fill(409));
        expect(answered.every((a) => Number(a.headers.get('retry-after')) >= 1)).toBe(true);
      } finally {
        // Released whatever the assertions said: a held request would hold the app's stop up.
        await send('/release');
        all = await Promise.all(storm);
      }
      expect(all.filter((a) => a.status === 201)).toHaveLength(1);
      expect(await runs()).toBe(before + 1);

      const replay = await send('/orders', { sku: 'jam', quantity: 1 }, key);
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(await runs()).toBe(before + 1);
    });

    it('the PostgreSQL store, on the tables of IDEMPOTENCY_SCHEMA_SQL: one run, then the replay', async () => {
      const key = idempotencyKey('order', 'postgres');
      const before = await runs();
      const first = await send('/pg-orders', { sku: 'rye' }, key);
      const again = await send('/pg-orders', { sku: 'rye' }, key);
      expect(first.status).toBe(201);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.body).toEqual(first.body);
      expect(await runs()).toBe(before + 1);
    });
  });

  it('@llm-workflows/client from an ES module against the api: one job, the retry a replay of it', async () => {
    const apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    const key = idempotencyKey('summary', 'packages', 1);
    const { stdout } = await run(
      process.execPath,
      [join(apps.get('12')!.dir, 'client.mjs'), apiUrl, TENANT_A.key, key],
      { cwd: apps.get('12')!.dir },
    );
    const { first, again } = JSON.parse(stdout) as Record<string, Awaited<ReturnType<typeof createSummary>>>;
    expect(first).toMatchObject({ outcome: 'succeeded', status: 202, replayed: false });
    expect(again).toMatchObject({ outcome: 'succeeded', status: 202, replayed: true });
    expect(again.outcome === 'succeeded' && first.outcome === 'succeeded' && again.body).toEqual(
      first.outcome === 'succeeded' && first.body,
    );
    expect(await api.redis.xlen(JOBS_STREAM)).toBe(1);
  });
});
