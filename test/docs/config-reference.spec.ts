import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { type AppSchema, configReferenceRows, env, renderConfigReference, withConfigReference } from '@app/config';

/*
 * docs/operations.md's Configuration table is rendered from the apps' schemas
 * (scripts/config-reference.mjs): each variable's meaning and default live
 * next to its definition, and the committed table must be what the script
 * renders, so the docs cannot drift from what the apps read.
 */
const ROOT = join(__dirname, '..', '..');
const COMMAND = 'node scripts/config-reference.mjs';

describe('the configuration reference', () => {
  it(`in docs/operations.md is what the apps' schemas render (else: run ${COMMAND})`, () => {
    let output = '';
    try {
      execFileSync(process.execPath, ['scripts/config-reference.mjs', '--check'], {
        cwd: ROOT,
        encoding: 'utf8',
        stdio: 'pipe',
      });
    } catch (err) {
      const e = err as { stderr?: string; stdout?: string; message: string };
      output = `${e.stderr || e.stdout || e.message}`.trim();
    }
    expect(output).toBe('');
  });

  it('renders one row per variable: "all" when every app reads it, one default when the apps agree', () => {
    const apps: AppSchema[] = [
      {
        app: 'a',
        schema: {
          shared: env.int('SHARED', 1, {}, { describe: 'read by | both' }),
          port: env.int('PORT', 3001),
          key: env.optionalString('KEY'),
          mode: env.custom('MODE', () => 'x', { docDefault: 'unset: the fake', describe: 'how' }),
        },
      },
      {
        app: 'b',
        schema: {
          shared: env.int('SHARED', 1, {}, { describe: 'read by | both' }),
          port: env.int('PORT', 3002),
          wait: env.secondsAsMs('WAIT_S', 0.5),
        },
      },
    ];
    expect(renderConfigReference(apps).split('\n')).toEqual([
      '| variable | apps | default | |',
      '| --- | --- | --- | --- |',
      '| `SHARED` | all | `1` | read by \\| both |',
      '| `PORT` | all | `3001`, `3002` | |',
      '| `KEY` | a | — | |',
      '| `MODE` | a | unset: the fake | how |',
      '| `WAIT_S` | b | `0.5` | |',
    ]);
  });

  it('refuses a variable the apps describe differently', () => {
    const apps: AppSchema[] = [
      { app: 'a', schema: { port: env.int('PORT', 1, {}, { describe: 'one' }) } },
      { app: 'b', schema: { port: env.int('PORT', 1, {}, { describe: 'another' }) } },
    ];
    expect(() => configReferenceRows(apps)).toThrow(/PORT .* is described differently/);
  });

  it('replaces only the text between the markers, and says when they are missing', () => {
    const doc = 'before\n<!-- config:begin -->\nold\n<!-- config:end -->\nafter\n';
    expect(withConfigReference(doc, 'new')).toBe('before\n<!-- config:begin -->\nnew\n<!-- config:end -->\nafter\n');
    expect(() => withConfigReference('no markers', 'new', 'x.md')).toThrow(/x\.md has no <!-- config:begin -->/);
  });
});
