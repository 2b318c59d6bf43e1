import { EmptyCompletionError } from './llm.errors';
import { sanitizeSummary } from './summary.sanitizer';

describe('sanitizeSummary', () => {
  it.each([
    ['plain text', 'A summary.', 'A summary.'],
    ['surrounding whitespace', '  A summary.\n', 'A summary.'],
    ['a NUL inside', 'A sum\u0000mary.', 'A summary.'],
    ['NULs around', '\u0000 A summary. \u0000', 'A summary.'],
    ['a lone high surrogate', 'A \ud800summary.', 'A \ufffdsummary.'],
    ['a lone low surrogate', 'A summary.\udc00', 'A summary.\ufffd'],
    ['a real pair, kept', 'A summary \ud83d\ude00', 'A summary \ud83d\ude00'],
  ])('%s', (_, content, stored) => {
    expect(sanitizeSummary(content)).toBe(stored);
  });

  it.each([
    ['null', null],
    ['undefined', undefined],
    ['empty', ''],
    ['whitespace', ' \n\t'],
    ['NULs and whitespace', '\u0000 \u0000\n'],
  ])('%s is an empty answer', (_, content) => {
    expect(() => sanitizeSummary(content)).toThrow(EmptyCompletionError);
  });
});
