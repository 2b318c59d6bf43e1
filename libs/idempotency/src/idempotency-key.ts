import { IdempotencyKeyInvalidException } from './idempotency.errors';

export const IDEMPOTENCY_KEY_HEADER = 'idempotency-key';
/**
 * In place of the key on routes that take it (`acceptsRunScope`): an agent's
 * run, whose every distinct request is an operation of its own (the scope
 * plus the body's fingerprint), so a retried request replays.
 */
export const IDEMPOTENCY_SCOPE_HEADER = 'idempotency-scope';
const MIN_LENGTH = 16;
const MAX_LENGTH = 128;

/**
 * The key from the Idempotency-Key header's values, each line as sent,
 * or undefined when there is none. Accepts a bare token and the Structured
 * Field string form of the IETF draft (`"..."`, with `\"` and `\\` escapes),
 * both normalised to the same value. `header` names it in the messages (an
 * Idempotency-Scope has the same syntax). Throws IdempotencyKeyInvalidException
 * for anything else.
 */
export function parseIdempotencyKey(
  values: readonly string[] | undefined,
  header = 'Idempotency-Key',
): string | undefined {
  if (values === undefined || values.length === 0) return undefined;
  if (values.length > 1) {
    throw new IdempotencyKeyInvalidException(`Send exactly one ${header} header.`, header);
  }
  const raw = values[0].trim();
  const key = raw.startsWith('"') ? unquote(raw, header) : raw;
  if (key.length < MIN_LENGTH || key.length > MAX_LENGTH) {
    throw new IdempotencyKeyInvalidException(
      `The key must be ${MIN_LENGTH} to ${MAX_LENGTH} characters long; it has ${key.length}.`,
      header,
    );
  }
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c <= 0x20 || c >= 0x7f) {
      throw new IdempotencyKeyInvalidException('The key must be printable ASCII without spaces.', header);
    }
    if (c === 0x2c) {
      throw new IdempotencyKeyInvalidException('The key must not contain a comma.', header);
    }
  }
  return key;
}

/** RFC 9651 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE */
function unquote(raw: string, header: string): string {
  let out = '';
  for (let i = 1; i < raw.length; i++) {
    const ch = raw[i];
    if (ch === '\\') {
      const next = raw[i + 1];
      if (next !== '"' && next !== '\\') {
        throw new IdempotencyKeyInvalidException('Only \\" and \\\\ may be escaped in a quoted key.', header);
      }
      out += next;
      i++;
    } else if (ch === '"') {
      if (i !== raw.length - 1) {
        throw new IdempotencyKeyInvalidException('A quoted key must end at its closing quote.', header);
      }
      return out;
    } else {
      out += ch;
    }
  }
  throw new IdempotencyKeyInvalidException('A quoted key needs its closing quote.', header);
}
