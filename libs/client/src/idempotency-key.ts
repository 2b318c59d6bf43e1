import { createHash } from 'node:crypto';

/** The header's rules (libs/idempotency's parser): 16..128 printable ASCII, no spaces or commas. */
export const IDEMPOTENCY_KEY_MIN_LENGTH = 16;
export const IDEMPOTENCY_KEY_MAX_LENGTH = 128;

const INTENT = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$/;
/** Characters a fact keeps as they are; everything else printable is %XX-encoded. */
const LITERAL = /^[A-Za-z0-9_.\-+=@!#$&'()*/;<>?[\]^`{|}]$/;
/** An encoded fact longer than this is hashed, so that a key with a few facts stays readable and short. */
const MAX_LITERAL_FACT = 40;
const HASHED_FACT = '~';
const HASHED_TAIL = '~~';
const PAD = '~';

export type KeyFact = string | number;

/**
 * A stable Idempotency-Key built from the business facts that name ONE
 * intention: `idempotencyKey('refund', ticketId, orderId)` →
 * `refund:T-1042:O-77`.
 *
 * One key per intention. Every attempt of the same intention must send the same
 * key: a retry, a restarted process, an agent turn that is re-run. So build the
 * key only from facts that are the same every time the intention is expressed
 * (the ticket, the order, the customer's request id), and never from a
 * timestamp, a random id (`randomUUID()`), an attempt or retry number, a
 * process id or anything else that changes between attempts: such a key makes
 * every retry a new operation (a second refund). Equally, include every fact
 * that distinguishes two legitimate operations: a key of only the order id is
 * too broad (a second, legitimate refund of that order on another ticket would
 * be refused as a reuse); a key with the time in it is too narrow (it never
 * repeats, so it never protects).
 *
 * Encoding, so that different fact lists never meet:
 * - facts are joined by `:` after each is encoded: `:` `%` `~` `,` `"` `\` and
 *   spaces become `%XX`, so `('a:b', 'c')` and `('a', 'b:c')` differ;
 * - a fact with characters outside printable ASCII, or longer than 40 encoded
 *   characters, becomes `~` + SHA-256 (base64url) of its UTF-8 bytes;
 * - if the whole key would exceed 128 characters, everything after the intent
 *   becomes `~~` + SHA-256 of the encoded facts;
 * - a key shorter than 16 is padded with `:~…` (never a fact's encoding).
 * Numbers are written in decimal, so `42` and `'42'` are the same fact.
 *
 * @param intent what the operation is (`refund`, `summary`): 1..32 of `A-Z a-z 0-9 _ . -`, starting with a letter or
 *   digit.
 * @param facts the business facts that name this one intention, in a fixed order.
 */
export function idempotencyKey(intent: string, ...facts: KeyFact[]): string {
  if (!INTENT.test(intent)) {
    throw new TypeError(
      `idempotencyKey: the intent must be 1..32 of A-Z a-z 0-9 _ . - (got ${JSON.stringify(intent)})`,
    );
  }
  const encoded = facts.map(encodeFact);
  let key = [intent, ...encoded].join(':');
  if (key.length > IDEMPOTENCY_KEY_MAX_LENGTH) {
    key = `${intent}:${HASHED_TAIL}${sha256(encoded.join(':'))}`;
  }
  if (key.length < IDEMPOTENCY_KEY_MIN_LENGTH) {
    // At least one '~': a bare ':' would read as one more, empty, fact.
    key += `:${PAD.repeat(Math.max(1, IDEMPOTENCY_KEY_MIN_LENGTH - key.length - 1))}`;
  }
  return key;
}

function encodeFact(fact: KeyFact): string {
  let text: string;
  if (typeof fact === 'number') {
    if (!Number.isFinite(fact)) throw new TypeError(`idempotencyKey: a number fact must be finite (got ${fact})`);
    text = String(fact);
  } else if (typeof fact === 'string') {
    text = fact;
  } else {
    throw new TypeError(`idempotencyKey: facts are strings or numbers (got ${typeof fact})`);
  }
  let out = '';
  for (const ch of text) {
    const code = ch.codePointAt(0) ?? 0;
    if (code < 0x20 || code > 0x7e) return HASHED_FACT + sha256(text);
    out += LITERAL.test(ch) ? ch : `%${code.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out.length > MAX_LITERAL_FACT ? HASHED_FACT + sha256(text) : out;
}

function sha256(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('base64url');
}
