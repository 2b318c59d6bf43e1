import { hash } from 'node:crypto';

/** A value still to be written, a literal to emit, or the end of an object or array (for cycle detection). */
type Step = { readonly value: unknown } | { readonly text: string } | { readonly leave: object };

/**
 * JSON with object keys sorted at every depth, so two bodies that differ only
 * in key order have one text. Arrays keep their order: it is meaningful.
 *
 * Iterative, not recursive: a request body nested thousands of levels deep
 * must not overflow the call stack (a RangeError here would be a 500). A
 * cycle, which no parsed body has, is a TypeError as in JSON.stringify.
 */
export function canonicalJson(value: unknown): string {
  const out: string[] = [];
  const open = new Set<object>();
  const steps: Step[] = [{ value }];
  while (steps.length > 0) {
    const step = steps.pop()!;
    if ('text' in step) {
      out.push(step.text);
      continue;
    }
    if ('leave' in step) {
      open.delete(step.leave);
      continue;
    }
    const v = step.value;
    if (v === undefined) {
      out.push('null');
      continue;
    }
    if (v === null || typeof v !== 'object') {
      out.push(JSON.stringify(v) ?? 'null');
      continue;
    }
    if (open.has(v)) throw new TypeError('canonicalJson: the value contains a cycle');
    open.add(v);
    // Pushed in reverse: the stack pops them in order.
    if (Array.isArray(v)) {
      out.push('[');
      steps.push({ leave: v }, { text: ']' });
      for (let i = v.length - 1; i >= 0; i--) {
        steps.push({ value: v[i] as unknown });
        if (i > 0) steps.push({ text: ',' });
      }
      continue;
    }
    const record = v as Record<string, unknown>;
    const keys = Object.keys(record)
      .filter((k) => record[k] !== undefined)
      .sort();
    out.push('{');
    steps.push({ leave: v }, { text: '}' });
    for (let i = keys.length - 1; i >= 0; i--) {
      steps.push({ value: record[keys[i]] }, { text: `${JSON.stringify(keys[i])}:` });
      if (i > 0) steps.push({ text: ',' });
    }
  }
  return out.join('');
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const PUNCTUATION = {
  comma: Buffer.from(','),
  colon: Buffer.from(':'),
  openObject: Buffer.from('{'),
  closeObject: Buffer.from('}'),
  openArray: Buffer.from('['),
  closeArray: Buffer.from(']'),
  emptyObject: Buffer.from('{}'),
  emptyArray: Buffer.from('[]'),
};

/**
 * A value's canonical text: bytes (most of them views into the body), or a
 * container's pieces in order. Nested, not copied level by level, and
 * joined once at the end (copying each level's pieces into its parent's
 * made deep nesting quadratic).
 */
type Piece = Buffer | { readonly pieces: readonly Piece[] };

/** An object or array still open while the body is read. */
interface OpenContainer {
  readonly object: boolean;
  /** An object's member names, decoded, to sort by. */
  readonly names: string[];
  /** An object's member names' canonical texts. */
  readonly nameTexts: Buffer[];
  readonly values: Piece[];
}

/** A number's bytes, and those of true, false and null. */
function isLiteralByte(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x7a) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x45;
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

const NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?$/;
const SHORT_ESCAPES = new Set([0x22, 0x5c, 0x62, 0x66, 0x6e, 0x72, 0x74]); // " \ b f n r t
const LOWER_HEX = /^[0-9a-f]$/;

/**
 * The length of the escape at `at` (a backslash): positive when it is the
 * one JSON.stringify writes for its character, negative when the character
 * has another (`\/`, `\u0041`, upper-case hex): then the string's bytes as
 * sent are not its canonical text. Most strings with escapes are written as
 * JSON.stringify writes them (a prompt's line breaks and quotes).
 */
function escapeLength(buf: Buffer, at: number): number {
  const c = buf[at + 1];
  if (SHORT_ESCAPES.has(c)) return 2;
  if (c !== 0x75) return -2;
  // \u00XX in lower-case hex for a control character without a short escape.
  if (buf[at + 2] !== 0x30 || buf[at + 3] !== 0x30 || (buf[at + 4] !== 0x30 && buf[at + 4] !== 0x31)) return -6;
  const hex = String.fromCharCode(buf[at + 5]);
  if (!LOWER_HEX.test(hex)) return -6;
  const code = (buf[at + 4] - 0x30) * 16 + parseInt(hex, 16);
  return code === 0x08 || code === 0x09 || code === 0x0a || code === 0x0c || code === 0x0d ? -6 : 6;
}

/**
 * From the first backslash of a string: 1 + the index of its closing quote,
 * negated when an escape is not the one JSON.stringify writes; the buffer's
 * length + 1 when it has none.
 *
 * A tight loop over the bytes, not a native search per escape: a call to
 * Buffer#indexOf costs what some fifty bytes of this loop do, and strings
 * that have escapes at all have them every few dozen bytes (measured in
 * docs/benchmarks.md). Once an escape is found that is not canonical the
 * rest is only walked to its end (the string is written again anyway).
 */
function escapedStringEnd(buf: Buffer, from: number): number {
  const n = buf.length;
  let j = from;
  while (j < n) {
    const c = buf[j];
    if (c === QUOTE) return j + 1;
    if (c !== BACKSLASH) {
      j++;
      continue;
    }
    const e = buf[j + 1];
    // " \ b f n r t: as JSON.stringify writes them.
    if (e === 0x22 || e === 0x5c || e === 0x62 || e === 0x66 || e === 0x6e || e === 0x72 || e === 0x74) {
      j += 2;
      continue;
    }
    const length = escapeLength(buf, j);
    if (length < 0) return -(skipToQuote(buf, j) + 1);
    j += length;
  }
  return n + 1;
}

/** The index of the closing quote of a string, from a place inside it (at an escape or between them); n when none. */
function skipToQuote(buf: Buffer, from: number): number {
  const n = buf.length;
  let j = from;
  while (j < n) {
    const c = buf[j];
    if (c === QUOTE) return j;
    j += c === BACKSLASH ? 2 : 1;
  }
  return n;
}

/** The value of a hex digit's byte, -1 for any other byte. */
function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}

/** The code unit of `\uXXXX` at `at` (its backslash), -1 when it is not one. */
function unicodeEscapeAt(buf: Buffer, at: number): number {
  if (buf[at] !== BACKSLASH || buf[at + 1] !== 0x75) return -1;
  let code = 0;
  for (let k = 2; k < 6; k++) {
    const digit = hexValue(buf[at + k]);
    if (digit < 0) return -1;
    code = code * 16 + digit;
  }
  return code;
}

const HEX = '0123456789abcdef';

/**
 * A string whose escapes are not all JSON.stringify's, written as
 * JSON.stringify writes its value: `buf[start]` and `buf[end]` are its
 * quotes. Byte by byte into one buffer (the text never grows: every escape
 * it rewrites is at least as long as what replaces it), with no decoding of
 * the bytes between escapes and no JSON.parse and JSON.stringify of the
 * whole string, which cost as much again. Undefined when it is not a JSON
 * string (a raw control character, an unknown or short escape).
 */
function rewrittenString(buf: Buffer, start: number, end: number): Buffer | undefined {
  const out = Buffer.allocUnsafe(end - start + 1);
  let o = 0;
  const putUnicodeEscape = (code: number): void => {
    out[o++] = BACKSLASH;
    out[o++] = 0x75;
    for (let shift = 12; shift >= 0; shift -= 4) out[o++] = HEX.charCodeAt((code >> shift) & 15);
  };
  out[o++] = QUOTE;
  let j = start + 1;
  while (j < end) {
    const c = buf[j];
    if (c < 0x20) return undefined;
    if (c !== BACKSLASH) {
      out[o++] = c;
      j++;
      continue;
    }
    const e = buf[j + 1];
    if (e === 0x22 || e === 0x5c || e === 0x62 || e === 0x66 || e === 0x6e || e === 0x72 || e === 0x74) {
      out[o++] = BACKSLASH;
      out[o++] = e;
      j += 2;
      continue;
    }
    if (e === 0x2f) {
      out[o++] = 0x2f;
      j += 2;
      continue;
    }
    let code = unicodeEscapeAt(buf, j);
    if (code < 0 || j + 6 > end) return undefined;
    j += 6;
    if (code >= 0xd800 && code <= 0xdbff) {
      const low = j + 6 <= end ? unicodeEscapeAt(buf, j) : -1;
      if (low >= 0xdc00 && low <= 0xdfff) {
        j += 6;
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        out[o++] = 0xf0 | (code >> 18);
        out[o++] = 0x80 | ((code >> 12) & 0x3f);
        out[o++] = 0x80 | ((code >> 6) & 0x3f);
        out[o++] = 0x80 | (code & 0x3f);
      } else putUnicodeEscape(code);
      continue;
    }
    if (code >= 0xdc00 && code <= 0xdfff) putUnicodeEscape(code);
    else if (code === 0x22 || code === 0x5c) {
      out[o++] = BACKSLASH;
      out[o++] = code;
    } else if (code < 0x20) {
      const short = SHORT_CONTROL_ESCAPES.get(code);
      if (short === undefined) putUnicodeEscape(code);
      else {
        out[o++] = BACKSLASH;
        out[o++] = short;
      }
    } else if (code < 0x80) out[o++] = code;
    else if (code < 0x800) {
      out[o++] = 0xc0 | (code >> 6);
      out[o++] = 0x80 | (code & 0x3f);
    } else {
      out[o++] = 0xe0 | (code >> 12);
      out[o++] = 0x80 | ((code >> 6) & 0x3f);
      out[o++] = 0x80 | (code & 0x3f);
    }
  }
  out[o++] = QUOTE;
  return out.subarray(0, o);
}

/** The control characters JSON.stringify writes with a short escape: \b \t \n \f \r. */
const SHORT_CONTROL_ESCAPES = new Map([
  [0x08, 0x62],
  [0x09, 0x74],
  [0x0a, 0x6e],
  [0x0c, 0x66],
  [0x0d, 0x72],
]);

/** A member name as a string, from its canonical text (short, and nearly always ASCII without escapes). */
function nameOf(text: Buffer): string {
  for (let k = 1; k < text.length - 1; k++) {
    if (text[k] >= 0x80 || text[k] === BACKSLASH) return JSON.parse(text.toString('utf8')) as string;
  }
  return text.toString('latin1', 1, text.length - 1);
}

function closed(open: OpenContainer): Piece {
  const out: Piece[] = [open.object ? PUNCTUATION.openObject : PUNCTUATION.openArray];
  const order = open.values.map((_, k) => k);
  // By name as Array.prototype.sort() orders strings (UTF-16 code units);
  // a name given twice keeps both, in order, so the body still differs.
  if (open.object) {
    const { names } = open;
    order.sort((a, b) => (names[a] < names[b] ? -1 : names[a] > names[b] ? 1 : a - b));
  }
  for (let k = 0; k < order.length; k++) {
    if (k > 0) out.push(PUNCTUATION.comma);
    const m = order[k];
    if (open.object) out.push(open.nameTexts[m], PUNCTUATION.colon);
    out.push(open.values[m]);
  }
  out.push(open.object ? PUNCTUATION.closeObject : PUNCTUATION.closeArray);
  return { pieces: out };
}

/** The bytes of a Piece, in order, without recursion. */
function joined(root: Piece): Buffer {
  const out: Buffer[] = [];
  const stack: { readonly pieces: readonly Piece[]; next: number }[] = [{ pieces: [root], next: 0 }];
  while (stack.length > 0) {
    const top = stack[stack.length - 1];
    if (top.next === top.pieces.length) {
      stack.pop();
      continue;
    }
    const piece = top.pieces[top.next++];
    if (Buffer.isBuffer(piece)) out.push(piece);
    else stack.push({ pieces: piece.pieces, next: 0 });
  }
  return Buffer.concat(out);
}

/**
 * The canonical JSON of a JSON text, read from its bytes: the UTF-8 of what
 * canonicalJson() writes for its parsed value, except that each number is
 * kept as it was written. A provider parses the bytes, not our doubles:
 * `9007199254740993` is not `9007199254740992` to it, and `1.0` may not be
 * `1` (Python reads a float and an int), so two bodies whose numbers are
 * written differently have two texts. A name given twice is kept twice.
 * Strings are written as JSON.stringify writes them, so escapes that mean
 * one string make one text. Undefined when the bytes are not one JSON value
 * (the caller then falls back to the parsed value).
 *
 * One pass, with indexOf for the quotes and no decoding of the strings
 * (most of a body's bytes), iterative (no recursion to overflow however deep
 * the nesting).
 */
export function canonicalJsonBytes(bytes: Uint8Array): Buffer | undefined {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = buf.length;
  let i = 0;
  // A UTF-8 byte order mark, which the body parser's decoding drops too.
  if (n >= 3 && buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf) i = 3;
  const stack: OpenContainer[] = [];
  // The first backslash at or after where the last search began (-1: none
  // after it, so none after any later place either; -2: not searched yet):
  // one search serves all the strings before it.
  let nextBackslash = -2;
  /** The string starting at i (a quote): its canonical text, and i past it. */
  const readString = (): Buffer | undefined => {
    const start = i;
    const close = buf.indexOf(QUOTE, start + 1);
    if (close === -1) return undefined;
    if (nextBackslash === -2 || (nextBackslash !== -1 && nextBackslash <= start))
      nextBackslash = buf.indexOf(BACKSLASH, start + 1);
    if (nextBackslash === -1 || nextBackslash > close) {
      i = close + 1;
      return buf.subarray(start, i);
    }
    // Escapes inside: read on byte by byte from the first (see escapedStringEnd).
    const scanned = escapedStringEnd(buf, nextBackslash);
    const j = Math.abs(scanned) - 1;
    const canonical = scanned > 0;
    if (j >= n) return undefined;
    i = j + 1;
    if (canonical) return buf.subarray(start, i);
    return rewrittenString(buf, start, j);
  };
  const skipSpace = (): void => {
    while (i < n && isSpace(buf[i])) i++;
  };

  for (;;) {
    skipSpace();
    const top = stack.length > 0 ? stack[stack.length - 1] : undefined;
    // An object's member name, then its colon.
    if (top?.object && top.nameTexts.length === top.values.length) {
      if (buf[i] !== QUOTE) return undefined;
      const name = readString();
      if (name === undefined) return undefined;
      top.nameTexts.push(name);
      top.names.push(nameOf(name));
      skipSpace();
      if (buf[i] !== COLON) return undefined;
      i++;
      skipSpace();
    }
    // A value.
    const c = buf[i];
    let value: Piece;
    if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      i++;
      skipSpace();
      if (buf[i] !== (c === OPEN_OBJECT ? CLOSE_OBJECT : CLOSE_ARRAY)) {
        stack.push({ object: c === OPEN_OBJECT, names: [], nameTexts: [], values: [] });
        continue;
      }
      i++;
      value = c === OPEN_OBJECT ? PUNCTUATION.emptyObject : PUNCTUATION.emptyArray;
    } else if (c === QUOTE) {
      const string = readString();
      if (string === undefined) return undefined;
      value = string;
    } else {
      const start = i;
      while (i < n && isLiteralByte(buf[i])) i++;
      const literal = buf.toString('latin1', start, i);
      if (literal !== 'true' && literal !== 'false' && literal !== 'null' && !NUMBER.test(literal)) return undefined;
      value = buf.subarray(start, i);
    }
    // The value ends its container's member or item, and maybe the container, and so on up.
    for (;;) {
      const open = stack.length > 0 ? stack[stack.length - 1] : undefined;
      if (open === undefined) {
        skipSpace();
        return i === n ? joined(value) : undefined;
      }
      open.values.push(value);
      skipSpace();
      if (buf[i] === COMMA) {
        i++;
        break;
      }
      if (buf[i] !== (open.object ? CLOSE_OBJECT : CLOSE_ARRAY)) return undefined;
      i++;
      stack.pop();
      value = closed(open);
    }
  }
}

/** canonicalJsonBytes() as text. */
export function canonicalJsonText(bytes: Uint8Array): string | undefined {
  return canonicalJsonBytes(bytes)?.toString('utf8');
}

/**
 * The prefix of a fingerprint made with numbers as written. Records stored
 * before it have a bare SHA-256 hex of canonicalJson(JSON.parse(body)), which
 * reads `1.0` as `1`: a versioned fingerprint is compared with a versioned
 * one, a bare one with the request's legacy fingerprint (sameFingerprint).
 */
export const FINGERPRINT_VERSION = 'v2:';

/**
 * The fingerprint of a request body: FINGERPRINT_VERSION and the SHA-256 hex
 * of its canonical JSON, from its bytes as sent when they are given (numbers
 * as written; see canonicalJsonBytes), else from the parsed value. The two
 * are the same for a body whose numbers are written as JavaScript writes
 * them, which is how most clients write them.
 */
export function fingerprintBody(body: unknown, raw?: Uint8Array): string {
  const bytes = raw === undefined || raw.length === 0 ? undefined : canonicalJsonBytes(raw);
  return FINGERPRINT_VERSION + hash('sha256', bytes ?? canonicalJson(body));
}

/**
 * The fingerprint records had before numbers were fingerprinted as written:
 * the SHA-256 hex of the canonical JSON of the parsed body, unversioned.
 * Only for comparing with such a record; never stored again.
 */
export function legacyFingerprint(body: unknown): string {
  return hash('sha256', canonicalJson(body));
}

/**
 * Whether a stored fingerprint names the request's body: a versioned one
 * equals the request's `fingerprint`; an unversioned one (a record written
 * before the version, during a rollout or within its result TTL) equals the
 * request's legacy fingerprint, computed only then. No fallback from one to
 * the other: a new record never matches a body by its legacy fingerprint,
 * whose doubles let two bodies past 2^53 share one.
 */
export function sameFingerprint(stored: string, fingerprint: string, legacy: () => string): boolean {
  return stored.startsWith(FINGERPRINT_VERSION) ? stored === fingerprint : stored === legacy();
}

/**
 * The SHA-256 hex of a fingerprint, without its version: what identifiers
 * derived from it (the gateway's upstream Idempotency-Key) are made of, so
 * that they are the same as before the version for every body whose numbers
 * are written as JavaScript writes them.
 */
export function fingerprintDigest(fingerprint: string): string {
  return fingerprint.startsWith(FINGERPRINT_VERSION) ? fingerprint.slice(FINGERPRINT_VERSION.length) : fingerprint;
}
