import { createHash } from 'node:crypto';
import { idempotencyKey, type KeyFact } from './idempotency-key';

/** The header's rules, as libs/idempotency's parser applies them (test/client checks with the parser itself). */
const HEADER_RULE = /^[\x21-\x2b\x2d-\x7e]{16,128}$/;
const sha = (s: string) => createHash('sha256').update(s, 'utf8').digest('base64url');

/** A small seeded PRNG, so a failing fact set can be reproduced. */
function mulberry32(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const ALPHABET = [
  'a',
  'Z',
  '0',
  '9',
  ':',
  '%',
  '~',
  ',',
  ' ',
  '"',
  '\\',
  '-',
  '_',
  '/',
  'é',
  '€',
  '😀',
  '\n',
  '\u0000',
  '%3A',
  '~~',
];
function randomFacts(rand: () => number): KeyFact[] {
  const n = Math.floor(rand() * 6);
  return Array.from({ length: n }, () => {
    if (rand() < 0.15) return Math.floor(rand() * 1e6);
    const len = rand() < 0.1 ? 30 + Math.floor(rand() * 200) : Math.floor(rand() * 8);
    return Array.from({ length: len }, () => ALPHABET[Math.floor(rand() * ALPHABET.length)]).join('');
  });
}

describe('idempotencyKey', () => {
  it('reads as its facts when they are short and plain', () => {
    expect(idempotencyKey('refund', 'T-1042', 'O-77')).toBe('refund:T-1042:O-77');
  });

  it('is stable: the same facts give the same key, in any process, any time', () => {
    // A literal, not only a comparison of two calls: a change of encoding would
    // give every caller new keys and defeat deduplication across a deploy.
    expect(idempotencyKey('refund', 'ticket-1', 'order-1')).toBe('refund:ticket-1:order-1');
    expect(idempotencyKey('r', 1)).toBe('r:1:~~~~~~~~~~~~');
    expect(idempotencyKey('refund', 'Zoë', 'o')).toBe(`refund:~${sha('Zoë')}:o`);
    const rand = mulberry32(1);
    for (let i = 0; i < 200; i++) {
      const facts = randomFacts(rand);
      expect(idempotencyKey('refund', ...facts)).toBe(idempotencyKey('refund', ...facts.map((f) => f)));
    }
  });

  it('keeps to the header rules for many random fact sets', () => {
    const rand = mulberry32(42);
    for (let i = 0; i < 2000; i++) {
      const facts = randomFacts(rand);
      const key = idempotencyKey(rand() < 0.5 ? 'refund' : 'x', ...facts);
      expect({ facts, key, ok: HEADER_RULE.test(key) && !key.startsWith('"') }).toEqual({ facts, key, ok: true });
    }
  });

  it('never lets separators inside facts make two fact lists meet', () => {
    const pairs: [KeyFact[], KeyFact[]][] = [
      [
        ['a:b', 'c'],
        ['a', 'b:c'],
      ],
      [['a', ''], ['a']],
      [[''], []],
      [['a%3Ab'], ['a:b']],
      [['~'], ['%7E']],
      [['~~~~~~~~~~~~~~'], []], // the padding is not a fact
      [[`~${sha('é')}`], ['é']], // a fact that looks hashed is not the hash
      [['a,b'], ['a%2Cb']],
    ];
    for (const [a, b] of pairs) expect(idempotencyKey('i', ...a)).not.toBe(idempotencyKey('i', ...b));

    const rand = mulberry32(7);
    const seen = new Map<string, string>();
    for (let i = 0; i < 5000; i++) {
      const facts = randomFacts(rand).map(String); // 42 and '42' are the same fact, by design
      const key = idempotencyKey('refund', ...facts);
      const id = JSON.stringify(facts);
      expect(seen.get(key) ?? id).toBe(id);
      seen.set(key, id);
    }
  });

  it('hashes non-ASCII and long facts (SHA-256, base64url) and keeps the key within 128', () => {
    const long = 'x'.repeat(41);
    expect(idempotencyKey('refund', long, 'o')).toBe(`refund:~${sha(long)}:o`);
    expect(idempotencyKey('refund', 'x'.repeat(40), 'o')).toBe(`refund:${'x'.repeat(40)}:o`);
    expect(idempotencyKey('refund', 'Bestellung 12 für Jürgen')).toBe(`refund:~${sha('Bestellung 12 für Jürgen')}`);
    expect(idempotencyKey('refund', 'line\nbreak')).toBe(`refund:~${sha('line\nbreak')}`);

    const many = Array.from({ length: 10 }, (_, i) => `fact-${i}-${'y'.repeat(30)}`);
    const key = idempotencyKey('refund', ...many);
    expect(key).toMatch(/^refund:~~[A-Za-z0-9_-]{43}$/);
    expect(key).not.toBe(idempotencyKey('refund', ...many.slice(1)));
    const longest = idempotencyKey('a'.repeat(32), ...Array.from({ length: 3 }, () => 'z'.repeat(40)));
    expect(longest.length).toBeLessThanOrEqual(128);
  });

  it('refuses an intent outside its alphabet and a number that is not finite', () => {
    expect(() => idempotencyKey('', 'a')).toThrow(TypeError);
    expect(() => idempotencyKey('re fund', 'a')).toThrow(TypeError);
    expect(() => idempotencyKey('refund:x', 'a')).toThrow(TypeError);
    expect(() => idempotencyKey('a'.repeat(33), 'a')).toThrow(TypeError);
    expect(() => idempotencyKey('refund', Number.NaN)).toThrow(TypeError);
    expect(() => idempotencyKey('refund', Number.POSITIVE_INFINITY)).toThrow(TypeError);
  });
});
