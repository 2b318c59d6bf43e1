import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';

/** The client runs in any Node 24 program: only Node's built-ins, its own files and global fetch. */
describe('libs/client dependencies', () => {
  const root = join(__dirname, '..');
  const files = readdirSync(root, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.spec.ts'))
    .map((f) => join(root, f));

  it('imports nothing but node: built-ins, its own files and (in examples) @app/client', () => {
    expect(files.length).toBeGreaterThan(3);
    const offending: string[] = [];
    for (const file of files) {
      const source = readFileSync(file, 'utf8');
      for (const [, spec] of source.matchAll(/(?:from|import)\s*\(?\s*['"]([^'"]+)['"]/g)) {
        const inExamples = relative(root, file).startsWith('examples');
        const ok = spec.startsWith('node:') || spec.startsWith('./') || (inExamples && spec === '@app/client');
        if (!ok) offending.push(`${relative(root, file)}: ${spec}`);
      }
      if (/@nestjs\//.test(source)) offending.push(`${relative(root, file)}: mentions @nestjs`);
    }
    expect(offending).toEqual([]);
  });
});
