import { HttpStatus } from '@nestjs/common';
import type { ProblemDocument } from './problem';
import { ProblemTypes } from './problem-types';

/**
 * How much structure a JSON body may have, on top of its size in bytes. Each
 * bounds work that grows with structure rather than bytes: JSON.parse of one
 * object with 90,000 keys alone takes 25 ms; recursive code overflows its
 * stack on deep nesting (8 KB of brackets is 2,000 levels); class-transformer
 * handles an object's keys in time quadratic in their number; and every layer
 * after the parser (fingerprint, transform, validation) costs per value, so
 * 1 MiB of `0,` (half a million values) would hold the event loop for every
 * tenant.
 */
export interface JsonLimits {
  /** Objects and arrays nest at most this deep (`{}` is 1). */
  readonly maxDepth: number;
  /** Members of any one object. */
  readonly maxMembers: number;
  /** Values in the whole body: objects, arrays, strings, numbers, booleans, nulls. */
  readonly maxValues: number;
}

/** A limit the body is past, or a member name it gives twice in one object. */
export type JsonLimitExceeded =
  { readonly limit: keyof JsonLimits; readonly max: number } | { readonly limit: 'uniqueNames'; readonly name: string };

export function assertValidJsonLimits(limits: JsonLimits): void {
  for (const [name, n] of Object.entries(limits)) {
    if (!Number.isSafeInteger(n) || (n as number) < 1)
      throw new Error(`JSON limits: ${name} must be a positive integer, got ${String(n)}`);
  }
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COLON = 0x3a;
const COMMA = 0x2c;
const SPACE = 0x20;

/** A member name as JSON.parse reads it, from its bytes between the quotes. */
function nameAt(buf: Buffer, start: number, end: number, plain: boolean): string {
  if (plain) return buf.toString('latin1', start + 1, end);
  try {
    return JSON.parse(buf.toString('utf8', start, end + 1)) as string;
  } catch {
    // Not JSON: JSON.parse refuses the body after the scan.
    return buf.toString('utf8', start + 1, end);
  }
}

/**
 * The first limit the JSON text in `buf` is past, or undefined, found in one
 * pass over the bytes before JSON.parse builds anything: a body past a limit
 * costs about a millisecond per MiB to refuse, whatever its shape. Strings are
 * skipped byte by byte (UTF-8 continuation bytes are never `"` or `\`). Text
 * that is not JSON is counted as best it can be; JSON.parse refuses it after.
 *
 * A member name given twice in one object (`"a"` and `"\u0061"` are one
 * name) is refused too: JSON.parse keeps the last value, other parsers the
 * first or refuse the body, so a provider or a store may read another body
 * than we do, and two bodies read differently would share a fingerprint.
 */
export function scanJsonLimits(bytes: Uint8Array, limits: JsonLimits): JsonLimitExceeded | undefined {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const { maxDepth, maxMembers, maxValues } = limits;
  // Per open container: members so far (objects) or -1 (arrays).
  const members: number[] = [];
  // Per open object: the names of its members so far, once it has one.
  const names: (Set<string> | undefined)[] = [];
  let depth = 0;
  let values = 0;
  let expectKey = false;
  let inScalar = false;
  const n = buf.length;
  for (let i = 0; i < n; i++) {
    const c = buf[i];
    if (c === QUOTE) {
      inScalar = false;
      if (expectKey) {
        expectKey = false;
        if (++members[depth - 1] > maxMembers) return { limit: 'maxMembers', max: maxMembers };
        // Plain: ASCII without escapes, the name is its bytes.
        const start = i;
        let plain = true;
        for (i++; i < n; i++) {
          const s = buf[i];
          if (s === BACKSLASH) {
            i++;
            plain = false;
          } else if (s === QUOTE) break;
          else if (s >= 0x80) plain = false;
        }
        const name = nameAt(buf, start, i, plain);
        const seen = (names[depth - 1] ??= new Set());
        if (seen.has(name)) return { limit: 'uniqueNames', name };
        seen.add(name);
        continue;
      }
      if (++values > maxValues) return { limit: 'maxValues', max: maxValues };
      for (i++; i < n; i++) {
        const s = buf[i];
        if (s === BACKSLASH) i++;
        else if (s === QUOTE) break;
      }
    } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      inScalar = false;
      if (++values > maxValues) return { limit: 'maxValues', max: maxValues };
      if (++depth > maxDepth) return { limit: 'maxDepth', max: maxDepth };
      const object = c === OPEN_OBJECT;
      members[depth - 1] = object ? 0 : -1;
      names[depth - 1] = undefined;
      expectKey = object;
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
      inScalar = false;
      expectKey = false;
      if (depth > 0) depth--;
    } else if (c === COMMA) {
      inScalar = false;
      expectKey = depth > 0 && members[depth - 1] >= 0;
    } else if (c === COLON || c <= SPACE) {
      inScalar = false;
    } else if (!inScalar) {
      // The first byte of a number, true, false or null.
      inScalar = true;
      if (++values > maxValues) return { limit: 'maxValues', max: maxValues };
    }
  }
  return undefined;
}

/** At most this much of a name goes into the problem's detail. */
const NAME_SHOWN = 64;

export function jsonLimitProblem(exceeded: JsonLimitExceeded): ProblemDocument {
  switch (exceeded.limit) {
    case 'uniqueNames': {
      const name = exceeded.name.length > NAME_SHOWN ? `${exceeded.name.slice(0, NAME_SHOWN)}…` : exceeded.name;
      return {
        type: ProblemTypes.jsonDuplicateName,
        title: 'An object in the request body has a member name twice',
        status: HttpStatus.BAD_REQUEST,
        detail: `The name ${JSON.stringify(name)} appears twice in one object. JSON parsers differ on which value they keep, so the body means different things to different readers: send each name once.`,
      };
    }
    case 'maxDepth':
      return {
        type: ProblemTypes.jsonTooDeep,
        title: 'The request body is nested too deeply',
        status: HttpStatus.BAD_REQUEST,
        detail: `Objects and arrays in the body must not nest more than ${exceeded.max} levels.`,
      };
    case 'maxMembers':
      return {
        type: ProblemTypes.jsonTooManyMembers,
        title: 'An object in the request body has too many members',
        status: HttpStatus.BAD_REQUEST,
        detail: `No object in the body may have more than ${exceeded.max} members.`,
      };
    case 'maxValues':
      return {
        type: ProblemTypes.jsonTooManyValues,
        title: 'The request body has too many values',
        status: HttpStatus.BAD_REQUEST,
        detail: `The body must not hold more than ${exceeded.max} values (objects, arrays, strings, numbers, booleans and nulls).`,
      };
  }
}

/** Thrown from the JSON parser's verify hook: the body parser passes it on with this `type`. */
export class JsonLimitError extends Error {
  readonly type = 'json.limit.exceeded';

  constructor(readonly exceeded: JsonLimitExceeded) {
    super(
      exceeded.limit === 'uniqueNames'
        ? 'JSON body with a member name given twice'
        : `JSON body past ${exceeded.limit} ${exceeded.max}`,
    );
  }
}
