import { createHash } from 'node:crypto';

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

/** SHA-256 of the canonical JSON of a request body, hex. */
export function fingerprintBody(body: unknown): string {
  return createHash('sha256').update(canonicalJson(body)).digest('hex');
}
