import { type JsonLimits, scanJsonLimits } from './json-limits';

/** The same three figures, counted on the parsed value: what the byte scanner must agree with. */
function reference(value: unknown): { depth: number; members: number; values: number } {
  let depth = 0;
  let members = 0;
  let values = 0;
  const walk = (v: unknown, level: number): void => {
    values++;
    if (typeof v !== 'object' || v === null) return;
    depth = Math.max(depth, level + 1);
    const children = Array.isArray(v) ? v : Object.values(v);
    if (!Array.isArray(v)) members = Math.max(members, children.length);
    for (const child of children) walk(child, level + 1);
  };
  walk(value, 0);
  return { depth, members, values };
}

/** A small deterministic generator, so a failure names a seed that reproduces it. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
}

const NASTY_STRINGS = [
  '',
  'a',
  '"',
  '\\',
  '\\"',
  '{',
  '}',
  '[',
  ']',
  ',',
  ':',
  'x":1,"y',
  'naïve ☃ 💩',
  '\u0000',
  '\n\t',
  'true',
  '-1.5e3',
];

function generate(rnd: () => number, level: number): unknown {
  const pick = rnd();
  if (level > 6 || pick < 0.35) {
    const scalars = [null, true, false, 0, -1.5e-3, 123456789, NASTY_STRINGS[Math.floor(rnd() * NASTY_STRINGS.length)]];
    return scalars[Math.floor(rnd() * scalars.length)];
  }
  const size = Math.floor(rnd() * 6);
  if (pick < 0.65) return Array.from({ length: size }, () => generate(rnd, level + 1));
  const obj: Record<string, unknown> = {};
  for (let i = 0; i < size; i++)
    obj[`${NASTY_STRINGS[Math.floor(rnd() * NASTY_STRINGS.length)]}${i}`] = generate(rnd, level + 1);
  return obj;
}

describe('scanJsonLimits', () => {
  const none: JsonLimits = { maxDepth: 1e9, maxMembers: 1e9, maxValues: 1e9 };

  it('agrees with the parsed value on depth, members and values, for any JSON (1,000 random documents, pretty-printed or not)', () => {
    for (let seed = 1; seed <= 1000; seed++) {
      const value = { root: generate(random(seed), 0) };
      const text = seed % 2 ? JSON.stringify(value) : JSON.stringify(value, null, 2);
      const buf = Buffer.from(text);
      const r = reference(JSON.parse(text));
      const at = (l: Partial<JsonLimits>) => scanJsonLimits(buf, { ...none, ...l });
      const context = `seed ${seed}: ${text}`;
      expect([context, at({})]).toEqual([context, undefined]);
      expect([context, at({ maxDepth: r.depth })]).toEqual([context, undefined]);
      expect([context, at({ maxDepth: r.depth - 1 })?.limit]).toEqual([context, 'maxDepth']);
      expect([context, at({ maxMembers: r.members })]).toEqual([context, undefined]);
      expect([context, at({ maxMembers: r.members - 1 })?.limit]).toEqual([context, 'maxMembers']);
      expect([context, at({ maxValues: r.values })]).toEqual([context, undefined]);
      expect([context, at({ maxValues: r.values - 1 })?.limit]).toEqual([context, 'maxValues']);
    }
  });

  it('counts each member against maxMembers', () => {
    expect(scanJsonLimits(Buffer.from('{"a":1,"b":2,"c":3}'), { ...none, maxMembers: 2 })).toEqual({
      limit: 'maxMembers',
      max: 2,
    });
  });

  it.each([
    ['{"a":1,"a":2}', 'a'],
    ['{"x":{"model":"a","stream":false,"model":"b"}}', 'model'],
    ['[{"k":1},{"k":2,"k":3}]', 'k'],
    ['{"a":1,"\\u0061":2}', 'a'],
    ['{"é":1,"\\u00e9":2}', 'é'],
    ['{"__proto__":1,"__proto__":2}', '__proto__'],
  ])('refuses a member name given twice in one object: %s', (json, name) => {
    expect(scanJsonLimits(Buffer.from(json), none)).toEqual({ limit: 'uniqueNames', name });
  });

  it.each(['{"a":{"a":1},"b":{"a":2}}', '[{"a":1},{"a":2}]', '{"a":"a","b":["a","a"]}', '{"a\\"":1,"a":2}'])(
    'takes one name in different objects, and strings that repeat a name: %s',
    (json) => {
      expect(scanJsonLimits(Buffer.from(json), none)).toBeUndefined();
    },
  );

  it('stops at the first limit, however long the rest', () => {
    const buf = Buffer.from(`[${'['.repeat(40)}${'0,'.repeat(500_000)}0${']'.repeat(41)}`);
    expect(scanJsonLimits(buf, { maxDepth: 32, maxMembers: 1000, maxValues: 20_000 })).toEqual({
      limit: 'maxDepth',
      max: 32,
    });
  });
});
