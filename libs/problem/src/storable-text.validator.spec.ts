import { isStorableText } from './storable-text.validator';

describe('isStorableText', () => {
  it.each([
    ['plain text', 'hello', true],
    ['every plane of Unicode, paired surrogates included', 'naïve ☃ 💩 𝄞 \uffff', true],
    ['the empty string', '', true],
    ['U+0000', 'a\u0000b', false],
    ['a lone high surrogate', 'a\ud800b', false],
    ['a lone low surrogate at the end', 'ab\udc00', false],
    ['a pair in the wrong order', '\udc00\ud800', false],
    ['not a string', 42, false],
  ])('%s: %s', (_, value, expected) => {
    expect(isStorableText(value)).toBe(expected);
  });
});
