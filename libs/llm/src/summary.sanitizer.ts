import { EmptyCompletionError } from './llm.errors';

/**
 * What a model answered, made storable: PostgreSQL's text refuses U+0000,
 * so it is removed, and an unpaired UTF-16 surrogate (which UTF-8 cannot
 * encode) becomes U+FFFD. Done in the client, inside the attempt, so an
 * answer that leaves nothing but whitespace is the EmptyCompletionError the
 * classifier already knows (permanent, `llm_empty_answer`), not a failed
 * database write later.
 */
export function sanitizeSummary(content: string | null | undefined): string {
  const text = typeof content === 'string' ? content.replaceAll('\u0000', '').toWellFormed().trim() : '';
  if (text === '') throw new EmptyCompletionError();
  return text;
}
