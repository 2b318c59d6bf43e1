import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BuildStamp, buildNeeded, sourcesHash } from './app-builds';

describe('the tests build the apps', () => {
  const bundles = { api: '10:1', worker: '20:2' };
  const stamp: BuildStamp = { sources: 'h1', bundles };

  it.each<[string, boolean, BuildStamp | undefined, string, Record<string, string> | undefined]>([
    ['no stamp (a fresh clone, CI)', true, undefined, 'h1', bundles],
    ['a bundle missing', true, stamp, 'h1', undefined],
    ['a source changed', true, stamp, 'h2', bundles],
    ['a bundle written since (npm run build)', true, stamp, 'h1', { ...bundles, api: '10:3' }],
    ['another set of apps', true, stamp, 'h1', { api: '10:1' }],
    ['the same sources, the bundles as built', false, stamp, 'h1', { ...bundles }],
  ])('%s: builds: %s', (_name, needed, saved, sources, current) => {
    expect(buildNeeded(saved, sources, current)).toBe(needed);
  });

  describe('sourcesHash', () => {
    let root: string;
    beforeEach(() => {
      root = mkdtempSync(join(tmpdir(), 'llmwf-app-builds-'));
      mkdirSync(join(root, 'libs', 'a', 'src'), { recursive: true });
      writeFileSync(join(root, 'libs', 'a', 'src', 'a.ts'), 'export const a = 1;\n');
      writeFileSync(join(root, 'tsconfig.json'), '{}\n');
    });
    afterEach(() => rmSync(root, { recursive: true, force: true }));

    it('changes with a source or the build configuration, not with a unit test', () => {
      const before = sourcesHash(root);
      writeFileSync(join(root, 'libs', 'a', 'src', 'a.spec.ts'), 'it("x", () => undefined);\n');
      expect(sourcesHash(root)).toBe(before);
      writeFileSync(join(root, 'libs', 'a', 'src', 'a.ts'), 'export const a = 2;\n');
      const edited = sourcesHash(root);
      expect(edited).not.toBe(before);
      writeFileSync(join(root, 'tsconfig.json'), '{"compilerOptions":{}}\n');
      expect(sourcesHash(root)).not.toBe(edited);
    });
  });
});
