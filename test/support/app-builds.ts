import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';

/** What the bundles are built from: the apps' and libs' code (not their unit tests) and the build's configuration. */
const SOURCE_DIRS = ['apps', 'libs'];
const SOURCE_FILES = ['tsconfig.json', 'nest-cli.json', 'package.json', 'package-lock.json'];
const isSource = (path: string): boolean => !path.endsWith('.spec.ts');

/** Where the last build by the tests recorded what it was built from, beside what it built. */
const STAMP = join('dist', '.test-build.json');

export interface BuildStamp {
  /** SHA-256 of the sources' paths and contents. */
  readonly sources: string;
  /** Each bundle's size and modification time once built: another build (npm run build) changes them. */
  readonly bundles: Readonly<Record<string, string>>;
}

function filesUnder(root: string, dir: string): string[] {
  const abs = join(root, dir);
  if (!existsSync(abs)) return [];
  return readdirSync(abs, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => relative(root, join(e.parentPath, e.name)));
}

export function sourcesHash(root: string): string {
  const hash = createHash('sha256');
  const files = [...SOURCE_DIRS.flatMap((d) => filesUnder(root, d)), ...SOURCE_FILES].filter(isSource).sort();
  for (const file of files) {
    hash.update(`${file}\0`);
    hash.update(existsSync(join(root, file)) ? readFileSync(join(root, file)) : '(none)');
    hash.update('\0');
  }
  return hash.digest('hex');
}

function bundles(root: string, apps: readonly string[]): Record<string, string> | undefined {
  const state: Record<string, string> = {};
  for (const app of apps) {
    const main = join(root, 'dist', 'apps', app, 'main.js');
    if (!existsSync(main)) return undefined;
    const s = statSync(main);
    state[app] = `${s.size}:${s.mtimeMs}`;
  }
  return state;
}

/**
 * Whether the bundles must be built: unless the last build by the tests was
 * from these very sources and nothing has written a bundle since, they are.
 * A fresh clone (CI) has no stamp, and builds.
 */
export function buildNeeded(
  saved: BuildStamp | undefined,
  sources: string,
  current: Readonly<Record<string, string>> | undefined,
): boolean {
  if (!saved || !current || saved.sources !== sources) return true;
  const apps = Object.keys(current);
  return apps.length !== Object.keys(saved.bundles).length || apps.some((a) => saved.bundles[a] !== current[a]);
}

function readStamp(root: string): BuildStamp | undefined {
  try {
    return JSON.parse(readFileSync(join(root, STAMP), 'utf8')) as BuildStamp;
  } catch {
    return undefined;
  }
}

/**
 * Builds the apps (`nest build <app>` each) unless dist/ already holds what
 * these sources build, and says which it did. A second run of one test file
 * after the first skips the four builds; a change to any source rebuilds.
 */
export function buildAppsUnlessCurrent(root: string, apps: readonly string[]): 'built' | 'current' {
  const sources = sourcesHash(root);
  if (!buildNeeded(readStamp(root), sources, bundles(root, apps))) return 'current';
  for (const app of apps) {
    execFileSync(join(root, 'node_modules', '.bin', 'nest'), ['build', app], { cwd: root, stdio: 'pipe' });
  }
  const built = bundles(root, apps);
  if (built) writeFileSync(join(root, STAMP), `${JSON.stringify({ sources, bundles: built } satisfies BuildStamp)}\n`);
  return 'built';
}
