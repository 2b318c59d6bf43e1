import { createHash } from 'node:crypto';

/**
 * JSON with object keys sorted at every depth, so two bodies that differ only
 * in key order have one text. Arrays keep their order: it is meaningful.
 */
export function canonicalJson(value: unknown): string {
  if (value === undefined) return 'null';
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.keys(value)
    .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`);
  return `{${entries.join(',')}}`;
}

/** SHA-256 of the canonical JSON of a request body, hex. */
export function fingerprintBody(body: unknown): string {
  return createHash('sha256').update(canonicalJson(body)).digest('hex');
}
