import { ValidateBy, type ValidationOptions } from 'class-validator';

/** U+0000, which PostgreSQL refuses in text and jsonb, and UTF-16 surrogates without their pair. */
export function isStorableText(value: unknown): boolean {
  return typeof value === 'string' && !value.includes('\u0000') && value.isWellFormed();
}

/**
 * A string PostgreSQL can store and any JSON peer can read: no U+0000 (text
 * and jsonb refuse it) and no unpaired surrogate (JSON.parse accepts `"\ud800"`,
 * but it is not Unicode text, so it is re-encoded or refused downstream).
 * Accepted at the door, such a string makes a job that can never finish.
 */
export function IsStorableText(options?: ValidationOptions): PropertyDecorator {
  return ValidateBy(
    {
      name: 'isStorableText',
      validator: {
        validate: isStorableText,
        defaultMessage: () => '$property must not contain U+0000 or unpaired UTF-16 surrogates',
      },
    },
    options,
  );
}
