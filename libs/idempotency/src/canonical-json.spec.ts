import { canonicalJson, fingerprintBody } from './canonical-json';

describe('canonicalJson', () => {
  it('sorts object keys at every depth and keeps array order', () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { z: 1, y: 2 }], c: null } })).toBe(
      '{"a":{"c":null,"d":[3,{"y":2,"z":1}]},"b":1}',
    );
  });

  it('escapes strings as JSON does', () => {
    expect(canonicalJson({ 'k"': 'line\nbreak ☃' })).toBe('{"k\\"":"line\\nbreak ☃"}');
  });

  it('treats a missing body as null', () => {
    expect(canonicalJson(undefined)).toBe('null');
  });

  it('nests without recursion: 100,000 levels deep do not overflow the stack', () => {
    const depth = 100_000;
    const deep: unknown = JSON.parse('['.repeat(depth) + ']'.repeat(depth));
    expect(canonicalJson({ extra: deep })).toBe(`{"extra":${'['.repeat(depth)}${']'.repeat(depth)}}`);
    // and writes what JSON.stringify writes (keys already sorted) for empty and nested containers
    const value = { a: [], b: {}, c: [[], [{}], [1, [2, [3]]]], d: { e: { f: 'g' } }, h: [null, true, 0.5] };
    expect(canonicalJson(value)).toBe(JSON.stringify(value));
  });

  it('refuses a cycle with a TypeError, but not a value that is merely shared', () => {
    const shared = { x: 1 };
    expect(canonicalJson({ a: shared, b: [shared, shared] })).toBe('{"a":{"x":1},"b":[{"x":1},{"x":1}]}');
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = { back: cyclic };
    expect(() => canonicalJson(cyclic)).toThrow(TypeError);
  });
});

describe('fingerprintBody', () => {
  it('is the same for the same body in any key order', () => {
    expect(fingerprintBody({ text: 'x', notify: 'a@b.c', meta: { b: 2, a: 1 } })).toBe(
      fingerprintBody({ meta: { a: 1, b: 2 }, notify: 'a@b.c', text: 'x' }),
    );
  });

  it('differs when a value, an array order or the nesting differs', () => {
    const base = fingerprintBody({ a: [1, 2] });
    expect(fingerprintBody({ a: [2, 1] })).not.toBe(base);
    expect(fingerprintBody({ a: [1, 2, 3] })).not.toBe(base);
    expect(fingerprintBody({ a: { 0: 1, 1: 2 } })).not.toBe(base);
    expect(fingerprintBody({ a: '1,2' })).not.toBe(base);
  });

  it('is a SHA-256 hex digest', () => {
    expect(fingerprintBody({})).toBe('44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a');
  });
});
