import {
  canonicalJson,
  canonicalJsonText,
  fingerprintBody,
  fingerprintDigest,
  legacyFingerprint,
  sameFingerprint,
} from './canonical-json';

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

describe('canonicalJsonText', () => {
  const text = (json: string) => canonicalJsonText(Buffer.from(json));

  it.each([
    '{"b":1,"a":{"d":[3,{"z":1,"y":2}],"c":null}}',
    ' { "model" : "gpt-4.1",\n\t"messages": [ {"role":"user","content":"héllo 🙂 \\"q\\" \\\\ \\n \\u00e9 \\ud83d\\ude42"} ],\r\n "stream": true } ',
    '{"a":[],"b":{},"c":[[],[{}],[1,[2,[3]]]],"d":{"e":{"f":"g"}},"h":[null,true,false,0.5,-2,1e+21,1.5e-7]}',
    '{"\\u0062":1,"a\\"":2,"":3,"é":4,"e":5,"😀":6,"\uffff":7}',
    '["x",{"k":"v"},[],"",0]',
    '{"__proto__":{"admin":true},"constructor":1}',
  ])('is what canonicalJson writes of the parsed value, for numbers written as JavaScript writes them: %j', (json) => {
    expect(text(json)).toBe(canonicalJson(JSON.parse(json)));
  });

  it('keeps each number as it was written', () => {
    expect(text('{"n":9007199254740993}')).toBe('{"n":9007199254740993}');
    expect(text('{"n":9007199254740993}')).not.toBe(text('{"n":9007199254740992}'));
    expect(text('[1.0,1,1e2,100,-0,0,0.10]')).toBe('[1.0,1,1e2,100,-0,0,0.10]');
  });

  it('writes a string the same however it was escaped', () => {
    expect(text('{"k":"\\u0061\\/b"}')).toBe(text('{"k":"a/b"}'));
    expect(text('{"\\u006b":"a"}')).toBe(text('{"k":"a"}'));
  });

  it.each([
    ['\\/ and upper-case hex', '"a\\/b\\u00E9\\u00e9\\u0041\\u002F"'],
    ['every short escape as \\u', '"\\u0008\\u0009\\u000a\\u000C\\u000d\\u0022\\u005c\\u005C"'],
    ['other controls, any case', '"\\u0000\\u001F\\u001f\\u0007\\u007f\\/"'],
    ['a surrogate pair, lone surrogates', '"\\uD83D\\uDE00 \\ud83d x \\udc00 \\uDBFF\\/ \\ud83d\\ud83d\\ude00"'],
    ['three-byte characters and raw non-ASCII', '"\\u2028\\uFFFF\\u0800 héllo 🙂 \\/"'],
    ['escapes JSON.stringify writes among them', '"\\\\\\/\\\\u0041 \\"\\/\\" \\n\\t\\\\"'],
    ['a string that ends in an escaped backslash', '"x\\/\\\\"'],
  ])('writes a string escaped otherwise as JSON.stringify would (%s)', (_what, string) => {
    const json = `{"k":${string},"m":[${string}]}`;
    expect(text(json)).toBe(canonicalJson(JSON.parse(json)));
  });

  it.each(['"\\/\\x"', '"\\/\\u12"', '"\\/\\u12G4"', '"\\/\u0001"', '"\\/\\'])(
    'is undefined for a string escaped otherwise that is not JSON: %j',
    (string) => {
      expect(text(`{"k":${string}}`)).toBeUndefined();
    },
  );

  it('keeps a name given twice twice, in order, so the body differs from either reading', () => {
    expect(text('{"b":2,"a":1,"b":3}')).toBe('{"a":1,"b":2,"b":3}');
    expect(text('{"a":1,"b":3}')).not.toBe(text('{"b":2,"a":1,"b":3}'));
  });

  it('skips a byte order mark', () => {
    expect(canonicalJsonText(Buffer.from('\ufeff{"a":1}'))).toBe('{"a":1}');
  });

  it('nests without recursion: 100,000 levels deep do not overflow the stack', () => {
    const depth = 100_000;
    expect(text(`{"x":${'['.repeat(depth)}${']'.repeat(depth)}}`)).toBe(
      `{"x":${'['.repeat(depth)}${']'.repeat(depth)}}`,
    );
  });

  it.each(['', '{', '{"a":1', '{"a" 1}', '{"a":1,}', '[1 2]', '{"a":tru}', '{"a":01}', '{"a":1} x', '"open'])(
    'is undefined for what is not one JSON value: %j',
    (json) => {
      expect(text(json)).toBeUndefined();
    },
  );
});

describe('fingerprintBody', () => {
  it('reads the bytes when it has them: numbers past 2^53 or written otherwise differ', () => {
    const of = (json: string) => fingerprintBody(JSON.parse(json), Buffer.from(json));
    expect(of('{"seed":9007199254740993}')).not.toBe(of('{"seed":9007199254740992}'));
    expect(of('{"n":1.0}')).not.toBe(of('{"n":1}'));
    expect(of('{"b":1, "a":[1,2]}')).toBe(of('{"a":[1,2],"b":1}'));
    // the same digest as from the parsed value, when the numbers are written as JavaScript writes them
    expect(of('{ "b" : 1, "a" : [0.5, "x"] }')).toBe(fingerprintBody({ a: [0.5, 'x'], b: 1 }));
  });

  it('falls back to the parsed value when the bytes are not JSON', () => {
    expect(fingerprintBody({ a: 1 }, Buffer.from('a=1'))).toBe(fingerprintBody({ a: 1 }));
  });

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

  it('is a SHA-256 hex digest, versioned', () => {
    expect(fingerprintBody({})).toBe('v2:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a');
  });
});

describe('sameFingerprint', () => {
  const json = '{"temperature":1.0,"seed":9007199254740993}';
  const fingerprint = fingerprintBody(JSON.parse(json), Buffer.from(json));
  const legacyOf = (text: string) => () => legacyFingerprint(JSON.parse(text));

  it.each([
    ['a versioned record of the same body', fingerprint, json, true],
    [
      'a versioned record of a body JavaScript reads the same',
      fingerprintBody({ temperature: 1, seed: 9007199254740992 }),
      json,
      false,
    ],
    [
      'an unversioned record of the same body (1.0 read as 1)',
      legacyFingerprint({ temperature: 1, seed: 9007199254740992 }),
      json,
      true,
    ],
    ['an unversioned record of another body', legacyFingerprint({ temperature: 0.5 }), json, false],
  ])('%s', (_what, stored, request, same) => {
    expect(sameFingerprint(stored, fingerprint, legacyOf(request))).toBe(same);
  });

  it('never falls back to the legacy fingerprint for a versioned record', () => {
    const legacy = jest.fn(() => legacyFingerprint(JSON.parse(json)));
    expect(sameFingerprint(fingerprintBody({ other: true }), fingerprint, legacy)).toBe(false);
    expect(legacy).not.toHaveBeenCalled();
  });

  it('derives the same digest as the unversioned fingerprint for numbers written as JavaScript writes them', () => {
    const body = { model: 'm', temperature: 0.5, n: 2 };
    const raw = Buffer.from(JSON.stringify(body));
    expect(fingerprintDigest(fingerprintBody(body, raw))).toBe(legacyFingerprint(body));
    expect(fingerprintBody(body, raw).startsWith('v2:')).toBe(true);
  });
});
