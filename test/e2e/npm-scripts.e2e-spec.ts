import { MIGRATIONS } from '@app/persistence';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { cpSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from 'pg';
import { USAGE } from '../../apps/admin/src/commands';
import { BASE_DATABASE_URL, testDatabaseName } from '../support/infra';

/*
 * The npm scripts a newcomer runs in the first hour (README), as they run
 * them: `npm run <script>` in a shell's environment, whatever Node npm finds
 * on PATH, checked by what they print and how they exit.
 */

const ROOT = join(__dirname, '..', '..');

interface Run {
  readonly code: number | null;
  readonly out: string;
  readonly err: string;
}

/** `npm run <args>` in `cwd`, as from a shell with only PATH and HOME set, and `env`. */
async function npmRun(cwd: string, args: readonly string[], env: Record<string, string> = {}): Promise<Run> {
  const child = spawn('npm', ['run', ...args], {
    cwd,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (d: Buffer) => out.push(d));
  child.stderr.on('data', (d: Buffer) => err.push(d));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, out: Buffer.concat(out).toString('utf8'), err: Buffer.concat(err).toString('utf8') };
}

/** What the script wrote, without npm's own banner (`> name@version script`, `> command`, a blank line). */
const scriptLines = (out: string): string[] => out.split('\n').filter((l) => l !== '' && !l.startsWith('> '));

describe('npm run migration:run', () => {
  const name = `${testDatabaseName()}_migration_run`;
  const url = Object.assign(new URL(BASE_DATABASE_URL), { pathname: `/${name}` }).toString();
  let admin: Client;

  beforeAll(async () => {
    admin = new Client({ connectionString: BASE_DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
  });
  afterAll(async () => {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  });

  it('prints one line per migration applied on a fresh database, then that none is pending', async () => {
    const first = await npmRun(ROOT, ['migration:run'], { DATABASE_URL: url });
    expect({ code: first.code, lines: scriptLines(first.out) }).toEqual({
      code: 0,
      lines: MIGRATIONS.map((m) => `migration ${m.name}: applied`),
    });
    const second = await npmRun(ROOT, ['migration:run'], { DATABASE_URL: url });
    expect({ code: second.code, lines: scriptLines(second.out) }).toEqual({
      code: 0,
      lines: ['migrations: none pending'],
    });
    const db = new Client({ connectionString: url });
    await db.connect();
    try {
      const { rows } = await db.query<{ name: string }>('SELECT name FROM migrations ORDER BY id');
      expect(rows.map((r) => r.name)).toEqual(MIGRATIONS.map((m) => m.name));
    } finally {
      await db.end();
    }
  }, 60_000);
});

describe('npm run admin', () => {
  /**
   * The script builds the admin app into dist/ before running it: here in a
   * copy of the sources, so that it does not rewrite the bundle that other
   * suites are spawning meanwhile (the global setup builds dist/ once).
   */
  let scratch: string;

  beforeAll(() => {
    scratch = mkdtempSync(join(tmpdir(), 'llmwf-npm-admin-'));
    for (const entry of ['package.json', 'tsconfig.json', 'nest-cli.json', 'scripts', 'apps', 'libs'])
      cpSync(join(ROOT, entry), join(scratch, entry), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules'), join(scratch, 'node_modules'), 'dir');
  });
  afterAll(() => {
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  it('passes its arguments through scripts/node24.sh to the CLI: --help prints the usage and exits 0', async () => {
    const run = await npmRun(scratch, ['admin', '--', '--help']);
    // After npm's banner, the usage and nothing else (without the flag the CLI prints it too, but exits 2).
    expect({ code: run.code, usage: run.out.slice(run.out.indexOf('usage: admin')) }).toEqual({
      code: 0,
      usage: `${USAGE}\n`,
    });
  }, 60_000);
});
