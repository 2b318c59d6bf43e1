import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';

/*
 * Every relative link between README.md and docs/*.md names a file that
 * exists and, with a #fragment, a heading of that file (GitHub's anchors):
 * sections move between pages, and a link left behind is a dead end.
 */
const ROOT = join(__dirname, '..', '..');
const FILES = [
  join(ROOT, 'README.md'),
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => join(ROOT, 'docs', f)),
];

const withoutFences = (text: string): string => text.replace(/^(```|~~~)[\s\S]*?^\1[^\n]*$/gm, '');
const withoutCode = (text: string): string => withoutFences(text).replace(/`[^`\n]*`/g, '');

/** GitHub's anchor of a heading: text of code spans and links kept, punctuation but - and _ dropped, spaces to -. */
function anchorsOf(text: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const m of withoutFences(text).matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const slug = m[1]
      .replace(/`([^`]*)`/g, '$1')
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/[*~]/g, '')
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N}_\- ]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    anchors.add(n === 0 ? slug : `${slug}-${n}`);
  }
  return anchors;
}

describe('links between README.md and docs/', () => {
  const anchors = new Map(FILES.map((f) => [f, anchorsOf(readFileSync(f, 'utf8'))]));

  it.each(FILES.map((f) => [relative(ROOT, f), f]))('%s: every relative link and anchor resolves', (_name, file) => {
    const broken: string[] = [];
    for (const m of withoutCode(readFileSync(file, 'utf8')).matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
      const [path, fragment] = target.split('#', 2);
      const dest = path ? normalize(join(dirname(file), path)) : file;
      if (!existsSync(dest)) broken.push(`${target}: no file ${relative(ROOT, dest)}`);
      else if (fragment && anchors.has(dest) && !anchors.get(dest)!.has(fragment))
        broken.push(`${target}: no heading #${fragment}`);
      else if (fragment && !anchors.has(dest)) broken.push(`${target}: an anchor into a file that is not checked`);
    }
    expect(broken).toEqual([]);
  });

  it('makes the anchors as GitHub does: code spans kept, punctuation dropped, repeats numbered', () => {
    expect(anchorsOf('# The refunds route: `POST /v1/refunds`\n## Choosing a store\n## Choosing a store')).toEqual(
      new Set(['the-refunds-route-post-v1refunds', 'choosing-a-store', 'choosing-a-store-1']),
    );
  });
});
