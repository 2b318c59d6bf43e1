import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';

/*
 * Configuration is read and validated in one place: libs/config's
 * processEnv(), called by each app's loader. A read of process.env anywhere
 * else in the shipped code would be a variable no schema checks.
 */
const ROOT = join(__dirname, '..', '..', '..');

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return /\.ts$/.test(name) && !/\.spec\.ts$/.test(name) ? [path] : [];
  });
}

describe('process.env', () => {
  it('is read only by libs/config', () => {
    const files = [...sources(join(ROOT, 'apps')), ...sources(join(ROOT, 'libs')), join(ROOT, 'ormconfig.ts')];
    const readers = files
      .filter((f) => !f.startsWith(join(ROOT, 'libs', 'config') + '/'))
      .filter((f) => /\bprocess\.env\b/.test(readFileSync(f, 'utf8')))
      .map((f) => relative(ROOT, f));
    expect(files.length).toBeGreaterThan(50);
    expect(readers).toEqual([]);
  });
});
