import { parseIdempotencyKey } from './idempotency-key';
import { IdempotencyKeyInvalidException } from './idempotency.errors';

describe('parseIdempotencyKey', () => {
  it('is undefined without a header', () => {
    expect(parseIdempotencyKey(undefined)).toBeUndefined();
    expect(parseIdempotencyKey([])).toBeUndefined();
  });

  it('accepts a bare token of 16 to 128 printable ASCII characters', () => {
    expect(parseIdempotencyKey(['a'.repeat(16)])).toBe('a'.repeat(16));
    expect(parseIdempotencyKey(['Z'.repeat(128)])).toBe('Z'.repeat(128));
    expect(parseIdempotencyKey(['8e03978e-40d5-43e8-bc93-6894a57f9324'])).toBe('8e03978e-40d5-43e8-bc93-6894a57f9324');
    expect(parseIdempotencyKey(["!#$%&'*+-.^_`|~:/?@[]{}<>=;"])).toBe("!#$%&'*+-.^_`|~:/?@[]{}<>=;");
  });

  it('names the header it read in its refusal (an Idempotency-Scope has the same syntax)', () => {
    const refusal = (values: string[], header?: string) => {
      try {
        parseIdempotencyKey(values, header);
      } catch (err) {
        return (err as IdempotencyKeyInvalidException).problem;
      }
      throw new Error('not refused');
    };
    expect(refusal(['a'.repeat(16), 'b'.repeat(16)], 'Idempotency-Scope')).toMatchObject({
      title: 'The Idempotency-Scope header is malformed',
      detail: 'Send exactly one Idempotency-Scope header.',
    });
    expect(refusal(['"abc'], 'Idempotency-Scope')).toMatchObject({
      title: 'The Idempotency-Scope header is malformed',
    });
    expect(refusal(['a'.repeat(16), 'b'.repeat(16)])).toMatchObject({
      title: 'The Idempotency-Key header is malformed',
      detail: 'Send exactly one Idempotency-Key header.',
    });
  });

  it('normalises the Structured Field string form to the bare value', () => {
    expect(parseIdempotencyKey(['"8e03978e-40d5-43e8-bc93"'])).toBe('8e03978e-40d5-43e8-bc93');
    expect(parseIdempotencyKey(['"abcdefgh\\"ijklmnop"'])).toBe('abcdefgh"ijklmnop');
    expect(parseIdempotencyKey(['"abcdefgh\\\\ijklmnop"'])).toBe('abcdefgh\\ijklmnop');
  });

  it.each([
    ['15 characters', ['a'.repeat(15)]],
    ['129 characters', ['a'.repeat(129)]],
    ['an empty value', ['']],
    ['a space', ['abcdefgh ijklmnop']],
    ['a tab', ['abcdefgh\tijklmnop']],
    ['a comma (a list)', ['abcdefghij,klmnop']],
    ['a control character', ['abcdefgh\u0001ijklmnop']],
    ['DEL', ['abcdefgh\u007fijklmnop']],
    ['non-ASCII', ['abcdefghéijklmnop']],
    ['two headers', ['abcdefghijklmnop', 'abcdefghijklmnop']],
    ['an unterminated quote', ['"abcdefghijklmnop']],
    ['text after the closing quote', ['"abcdefghijklmnop";a=1']],
    ['an unknown escape', ['"abcdefgh\\nijklmnop"']],
    ['a short quoted key', ['"abc"']],
    ['a space inside quotes', ['"abcdefgh ijklmnop"']],
  ])('rejects %s', (_, values) => {
    expect(() => parseIdempotencyKey(values)).toThrow(IdempotencyKeyInvalidException);
  });
});
